package fqdn

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func msg(t *testing.T, q string, qtype uint16, rcode int, rrs ...string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(q, qtype)
	m.Response, m.Rcode = true, rcode
	for _, s := range rrs {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		m.Answer = append(m.Answer, rr)
	}
	return m
}

func TestAnswersOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *dns.Msg
		want []answered
	}{
		{"A", msg(t, "WWW.Example.com.", dns.TypeA, dns.RcodeSuccess, "www.example.com. 30 IN A 192.0.2.1", "www.example.com. 60 IN A 192.0.2.2"),
			[]answered{{Name: "www.example.com", IPs: addrs("192.0.2.1", "192.0.2.2"), TTL: 30 * time.Second}}},
		{"AAAA", msg(t, "v6.example.com.", dns.TypeAAAA, dns.RcodeSuccess, "v6.example.com. 10 IN AAAA 2001:db8::1"),
			[]answered{{Name: "v6.example.com", IPs: addrs("2001:db8::1"), TTL: 10 * time.Second}}},
		{"CNAME chain, its smallest TTL", msg(t, "a.example.com.", dns.TypeA, dns.RcodeSuccess,
			"a.example.com. 300 IN CNAME b.cdn.net.", "b.cdn.net. 5 IN CNAME c.cdn.net.", "c.cdn.net. 60 IN A 192.0.2.9"),
			[]answered{{Name: "a.example.com", IPs: addrs("192.0.2.9"), TTL: 5 * time.Second}}},
		{"records no question leads to are ignored", msg(t, "a.example.com.", dns.TypeA, dns.RcodeSuccess,
			"a.example.com. 30 IN A 192.0.2.1", "evil.example.org. 30 IN A 192.0.2.66"),
			[]answered{{Name: "a.example.com", IPs: addrs("192.0.2.1"), TTL: 30 * time.Second}}},
		{"a CNAME loop ends", msg(t, "l.example.com.", dns.TypeA, dns.RcodeSuccess,
			"l.example.com. 30 IN CNAME m.example.com.", "m.example.com. 30 IN CNAME l.example.com."),
			[]answered{{Name: "l.example.com", TTL: 30 * time.Second}}},
		{"several questions", func() *dns.Msg {
			m := msg(t, "a.example.com.", dns.TypeA, dns.RcodeSuccess, "a.example.com. 30 IN A 192.0.2.1", "b.example.com. 20 IN AAAA 2001:db8::2")
			m.Question = append(m.Question, dns.Question{Name: "b.example.com.", Qtype: dns.TypeAAAA, Qclass: dns.ClassINET})
			return m
		}(), []answered{{Name: "a.example.com", IPs: addrs("192.0.2.1"), TTL: 30 * time.Second}, {Name: "b.example.com", IPs: addrs("2001:db8::2"), TTL: 20 * time.Second}}},
		{"NXDOMAIN teaches nothing", msg(t, "no.example.com.", dns.TypeA, dns.RcodeNameError), nil},
		{"NODATA", msg(t, "a.example.com.", dns.TypeA, dns.RcodeSuccess), []answered{{Name: "a.example.com"}}},
		{"not A or AAAA", msg(t, "a.example.com.", dns.TypeTXT, dns.RcodeSuccess, "a.example.com. 30 IN A 192.0.2.1"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := answersOf(tc.m)
			if !slices.EqualFunc(got, tc.want, func(a, b answered) bool {
				return a.Name == b.Name && a.TTL == b.TTL && slices.Equal(a.IPs, b.IPs)
			}) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// FuzzAnswersOf: no message panics, and what an answer teaches is only
// ever the names asked (canonical) with addresses of the answer section.
func FuzzAnswersOf(f *testing.F) {
	for _, m := range []*dns.Msg{
		msg(&testing.T{}, "a.example.com.", dns.TypeA, dns.RcodeSuccess, "a.example.com. 300 IN CNAME b.cdn.net.", "b.cdn.net. 5 IN A 192.0.2.9"),
		msg(&testing.T{}, "v6.example.com.", dns.TypeAAAA, dns.RcodeSuccess, "v6.example.com. 10 IN AAAA 2001:db8::1"),
	} {
		b, _ := m.Pack()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m := new(dns.Msg)
		if m.Unpack(b) != nil {
			return
		}
		in := map[netip.Addr]bool{}
		for _, rr := range m.Answer {
			switch r := rr.(type) {
			case *dns.A:
				ip, _ := netip.AddrFromSlice(r.A.To4())
				in[ip.Unmap()] = true
			case *dns.AAAA:
				ip, _ := netip.AddrFromSlice(r.AAAA.To16())
				in[ip.Unmap()] = true
			}
		}
		for _, a := range answersOf(m) {
			if !slices.ContainsFunc(m.Question, func(q dns.Question) bool {
				return dns.CanonicalName(q.Name) == a.Name+"." || q.Name == "." && a.Name == ""
			}) {
				t.Fatalf("learnt %q, not a question of %v", a.Name, m.Question)
			}
			for _, ip := range a.IPs {
				if !in[ip] {
					t.Fatalf("learnt %s, not in the answer", ip)
				}
			}
		}
	})
}
