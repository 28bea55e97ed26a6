package fqdn

import (
	"net/netip"
	"slices"
	"time"

	"github.com/miekg/dns"

	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// answered is what an answer says of one name asked: its addresses and
// for how long they hold.
type answered struct {
	// Name is the question's name, canonical.
	Name string
	// IPs are the A and AAAA records the name leads to, directly or
	// through a chain of CNAMEs, sorted, without repeats.
	IPs []netip.Addr
	// TTL is the smallest TTL along the records that led to the
	// addresses (a CNAME that expires takes its addresses with it).
	TTL time.Duration
}

// maxChain bounds the CNAMEs followed from a question (a loop, or a
// hostile answer, ends there).
const maxChain = 16

// answersOf reads a response: per question of class IN, the addresses its
// name leads to in the answer section, following CNAMEs from the
// question's name (owner names compared as DNS does: case-insensitive).
// Records that no question leads to are ignored: an answer cannot vouch
// for names the pod did not ask. A question with no addresses is
// returned with none (a NODATA or NXDOMAIN teaches nothing).
func answersOf(m *dns.Msg) []answered {
	if m == nil || !m.Response || m.Opcode != dns.OpcodeQuery || m.Rcode != dns.RcodeSuccess {
		return nil
	}
	var out []answered
	for _, q := range m.Question {
		if q.Qclass != dns.ClassINET || (q.Qtype != dns.TypeA && q.Qtype != dns.TypeAAAA && q.Qtype != dns.TypeANY) {
			continue
		}
		a := answered{Name: endpoints.CanonicalName(q.Name)}
		name, ttl := a.Name, uint32(0)
		first := true
		for range maxChain {
			next := ""
			for _, rr := range m.Answer {
				h := rr.Header()
				if h.Class != dns.ClassINET || endpoints.CanonicalName(h.Name) != name {
					continue
				}
				var ip netip.Addr
				switch r := rr.(type) {
				case *dns.A:
					ip, _ = netip.AddrFromSlice(r.A.To4())
				case *dns.AAAA:
					ip, _ = netip.AddrFromSlice(r.AAAA.To16())
				case *dns.CNAME:
					if next == "" {
						next = endpoints.CanonicalName(r.Target)
						if first || h.Ttl < ttl {
							ttl, first = h.Ttl, false
						}
					}
					continue
				default:
					continue
				}
				if !ip.IsValid() {
					continue
				}
				a.IPs = append(a.IPs, ip.Unmap())
				if first || h.Ttl < ttl {
					ttl, first = h.Ttl, false
				}
			}
			if next == "" || next == name {
				break
			}
			name = next
		}
		slices.SortFunc(a.IPs, netip.Addr.Compare)
		a.IPs = slices.Compact(a.IPs)
		a.TTL = time.Duration(ttl) * time.Second
		out = append(out, a)
	}
	return out
}
