package dnsproxy

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestPrivilegedProxy runs the proxy and the redirect in a node netns
// between two pods and a resolver: pod A's DNS goes through the proxy,
// pod B's does not.
func TestPrivilegedProxy(t *testing.T) {
	topo := newTopology(t)
	hooks := newHookLog()
	cfg := Config{IPv4: true, IPv6: true, Timeout: time.Second, MaxInFlight: 8, Mark: testMark}
	p, r, stop := topo.startProxy(cfg, hooks.hook, podA, podA6)

	// ask looks a name up from pod A and checks the answer came through
	// the proxy: the hook saw it, from pod A, to the resolver asked, with
	// the answer the pod got.
	ask := func(t *testing.T, network, server, name string, qtype, edns uint16) *dns.Msg {
		t.Helper()
		before := len(hooks.seen())
		fromNode := topo.dns.count(nodeIP) + topo.dns.count(node6)
		m, err := lookup(topo.aNS, network, server, name, qtype, edns)
		if err != nil {
			t.Fatalf("%s %s from pod A: %s", network, name, err)
		}
		seen := hooks.seen()
		if len(seen) != before+1 {
			t.Fatalf("%s %s: the hook saw %d queries, want 1", network, name, len(seen)-before)
		}
		q := seen[len(seen)-1]
		pod := podA
		if strings.Contains(server, ":") {
			pod = podA6
		}
		// With SERVFAIL the pod gets no record of the answer the hook saw.
		records := len(m.Answer) == len(q.Answer.Answer) || m.Rcode == dns.RcodeServerFailure && len(m.Answer) == 0
		if q.Pod.String() != pod || q.PodPort == 0 || q.Resolver != netip.AddrPortFrom(netip.MustParseAddr(server), 53) ||
			q.Proto != network || q.Request.Question[0].Name != name || q.Answer.Id != m.Id || !records {
			t.Errorf("the hook saw pod %s:%d, resolver %s, %s, %v -> %d records; the pod got %d",
				q.Pod, q.PodPort, q.Resolver, q.Proto, q.Request.Question, len(q.Answer.Answer), len(m.Answer))
		}
		if n := topo.dns.count(nodeIP) + topo.dns.count(node6); n != fromNode+1 {
			t.Errorf("the resolver was asked %d times from the node, want 1 (through the proxy)", n-fromNode)
		}
		return m
	}
	wantA := func(t *testing.T, m *dns.Msg, want string) {
		t.Helper()
		if m.Rcode != dns.RcodeSuccess || len(m.Answer) == 0 {
			t.Fatalf("answer %s with %d records", dns.RcodeToString[m.Rcode], len(m.Answer))
		}
		var got string
		switch rr := m.Answer[len(m.Answer)-1].(type) {
		case *dns.A:
			got = rr.A.String()
		case *dns.AAAA:
			got = rr.AAAA.String()
		}
		if got != want {
			t.Errorf("answered %s, want %s", got, want)
		}
	}

	t.Run("redirect rules", func(t *testing.T) {
		rules := topo.inNode("iptables", "-t", "mangle", "-S")
		if !strings.Contains(rules, "-A PREROUTING -j "+Chain) || strings.Count(rules, "-A "+Chain+" ") != 2 {
			t.Errorf("iptables -t mangle -S:\n%s", rules)
		}
		if rules6 := topo.inNode("ip6tables", "-t", "mangle", "-S"); strings.Count(rules6, "-A "+Chain+" ") != 2 {
			t.Errorf("ip6tables -t mangle -S:\n%s", rules6)
		}
		if out := topo.inNode("ip", "rule"); !strings.Contains(out, "fwmark 0x4000/0x4000 lookup 4053") {
			t.Errorf("ip rule:\n%s", out)
		}
		t.Log(rules)
	})
	t.Run("udp", func(t *testing.T) {
		wantA(t, ask(t, "udp", resolver, "a.example.", dns.TypeA, 0), "192.0.2.1")
	})
	t.Run("tcp", func(t *testing.T) {
		wantA(t, ask(t, "tcp", resolver, "a.example.", dns.TypeA, 0), "192.0.2.1")
	})
	t.Run("cname", func(t *testing.T) {
		m := ask(t, "udp", resolver, "c.example.", dns.TypeA, 0)
		if _, ok := m.Answer[0].(*dns.CNAME); !ok {
			t.Errorf("first record %s", m.Answer[0])
		}
		wantA(t, m, "192.0.2.1")
	})
	t.Run("ipv6 udp", func(t *testing.T) {
		wantA(t, ask(t, "udp", resolver6, "a.example.", dns.TypeAAAA, 0), "2001:db8::1")
	})
	t.Run("ipv6 tcp", func(t *testing.T) {
		wantA(t, ask(t, "tcp", resolver6, "a.example.", dns.TypeAAAA, 0), "2001:db8::1")
	})
	t.Run("edns0 large answer over udp", func(t *testing.T) {
		for _, server := range []string{resolver, resolver6} {
			m := ask(t, "udp", server, "big.example.", dns.TypeA, 4096)
			if m.Truncated || len(m.Answer) != bigAnswers {
				t.Errorf("%s: TC %t, %d records, want %d", server, m.Truncated, len(m.Answer), bigAnswers)
			}
		}
	})
	t.Run("truncated then tcp", func(t *testing.T) {
		m := ask(t, "udp", resolver, "big.example.", dns.TypeA, 0)
		if !m.Truncated || len(m.Answer) == bigAnswers {
			t.Fatalf("over UDP without EDNS0: TC %t, %d records", m.Truncated, len(m.Answer))
		}
		m = ask(t, "tcp", resolver, "big.example.", dns.TypeA, 0)
		if m.Truncated || len(m.Answer) != bigAnswers {
			t.Errorf("over TCP: TC %t, %d records", m.Truncated, len(m.Answer))
		}
	})
	t.Run("nxdomain", func(t *testing.T) {
		if m := ask(t, "udp", resolver, "nowhere.example.", dns.TypeA, 0); m.Rcode != dns.RcodeNameError {
			t.Errorf("rcode %s", dns.RcodeToString[m.Rcode])
		}
	})
	t.Run("hook error is SERVFAIL", func(t *testing.T) {
		for _, network := range []string{"udp", "tcp"} {
			if m := ask(t, network, resolver, "deny.example.", dns.TypeA, 0); m.Rcode != dns.RcodeServerFailure || len(m.Answer) != 0 {
				t.Errorf("%s: %s with %d records, want SERVFAIL", network, dns.RcodeToString[m.Rcode], len(m.Answer))
			}
		}
		if n := p.Stats().ServFail[ReasonHook]; n != 2 {
			t.Errorf("SERVFAIL for the hook: %d, want 2", n)
		}
	})
	t.Run("a pod past its share of MaxInFlight is SERVFAIL at once", func(t *testing.T) {
		release := make(chan struct{})
		hooks.mu.Lock()
		hooks.hold["slow.example."] = release
		hooks.mu.Unlock()
		var wg sync.WaitGroup
		share := cfg.MaxInFlight / podShare
		for range share {
			wg.Go(func() { lookup(topo.aNS, "udp", resolver, "slow.example.", dns.TypeA, 0) })
		}
		for held := 0; held < share; {
			select {
			case <-hooks.held:
				held++
			case <-time.After(2 * time.Second):
				// A lookup that never reached the hook (its datagram lost
				// under load, or refused while a slot of an earlier
				// subtest's was still taken): another in its place.
				wg.Go(func() { lookup(topo.aNS, "udp", resolver, "slow.example.", dns.TypeA, 0) })
			}
		}
		overloaded := p.Stats().ServFail[ReasonOverload]
		start := time.Now()
		m, err := lookup(topo.aNS, "udp", resolver, "a.example.", dns.TypeA, 0)
		if err != nil || m.Rcode != dns.RcodeServerFailure {
			t.Errorf("past MaxInFlight: %v, %v; want SERVFAIL", m, err)
		}
		if d := time.Since(start); d > 200*time.Millisecond {
			t.Errorf("SERVFAIL after %s", d)
		}
		close(release)
		wg.Wait()
		if n := p.Stats().ServFail[ReasonOverload] - overloaded; n != 1 {
			t.Errorf("SERVFAIL for overload: %d, want 1", n)
		}
	})
	t.Run("pod B is not redirected", func(t *testing.T) {
		before, fromB := len(hooks.seen()), topo.dns.count(podB)
		for _, network := range []string{"udp", "tcp"} {
			m, err := lookup(topo.bNS, network, resolver, "a.example.", dns.TypeA, 0)
			if err != nil {
				t.Fatalf("%s from pod B: %s", network, err)
			}
			wantA(t, m, "192.0.2.1")
		}
		if n := len(hooks.seen()) - before; n != 0 {
			t.Errorf("the hook saw %d of pod B's queries", n)
		}
		if n := topo.dns.count(podB) - fromB; n != 2 {
			t.Errorf("the resolver got %d queries from pod B itself, want 2", n)
		}
	})
	t.Run("not DNS is dropped", func(t *testing.T) {
		fromNode := topo.dns.count(nodeIP)
		err := inNSOf(topo.aNS, func() error {
			c, err := net.Dial("udp4", net.JoinHostPort(resolver, "53"))
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(300 * time.Millisecond))
			if _, err := c.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
				return err
			}
			_, err = c.Read(make([]byte, 512))
			return err
		})
		if err == nil {
			t.Error("a datagram that is not DNS got an answer")
		}
		if n := topo.dns.count(nodeIP) - fromNode; n != 0 {
			t.Errorf("forwarded %d times", n)
		}
		if n := p.Stats().Dropped[ReasonMalformed]; n != 1 {
			t.Errorf("dropped as malformed: %d, want 1", n)
		}
	})
	t.Run("resolver not answering is SERVFAIL", func(t *testing.T) {
		var m *dns.Msg
		err := inNSOf(topo.aNS, func() (err error) {
			c := &dns.Client{Net: "udp", Timeout: 3 * cfg.Timeout}
			m, _, err = c.Exchange(question("a.example.", dns.TypeA), "10.0.1.99:53")
			return err
		})
		if err != nil || m.Rcode != dns.RcodeServerFailure {
			t.Errorf("%v, %v; want SERVFAIL", m, err)
		}
		if n := p.Stats().ServFail[ReasonUpstream]; n != 1 {
			t.Errorf("SERVFAIL for the upstream: %d, want 1", n)
		}
	})
	t.Run("the proxy's own port is not served", func(t *testing.T) {
		before := len(hooks.seen())
		for _, network := range []string{"udp", "tcp"} {
			var m *dns.Msg
			err := inNSOf(topo.aNS, func() (err error) {
				c := &dns.Client{Net: network, Timeout: 300 * time.Millisecond}
				q := question("a.example.", dns.TypeA)
				m, _, err = c.Exchange(q, netip.AddrPortFrom(netip.MustParseAddr(gateway), p.Port()).String())
				return err
			})
			if err == nil {
				t.Errorf("%s to the proxy's port: answered %v", network, m)
			}
		}
		if len(hooks.seen()) != before {
			t.Error("the hook saw a query to the proxy's port")
		}
		if n := p.Stats().Dropped[ReasonOrigDst]; n != 2 {
			t.Errorf("dropped for the destination: %d, want 2", n)
		}
	})
	t.Run("sync", func(t *testing.T) {
		listing := func() string {
			return topo.inNode("iptables", "-t", "mangle", "-S", Chain)
		}
		chain := listing()
		// The same set again writes nothing, and a foreign rule put
		// first makes Sync move the jump back in front of it.
		topo.inNode("iptables", "-t", "mangle", "-I", "PREROUTING", "1", "-j", "ACCEPT", "-p", "udp", "--dport", "9")
		t.Cleanup(func() {
			topo.inNode("iptables", "-t", "mangle", "-D", "PREROUTING", "-j", "ACCEPT", "-p", "udp", "--dport", "9")
		})
		resync := func(pods ...string) {
			t.Helper()
			var addrs []netip.Addr
			for _, s := range pods {
				addrs = append(addrs, netip.MustParseAddr(s))
			}
			if err := inNS(topo, func() error { return r.Sync(addrs) }); err != nil {
				t.Fatal(err)
			}
		}
		resync(podA, podA6)
		if after := listing(); after != chain {
			t.Errorf("the chain changed:\n%s\nthen\n%s", chain, after)
		}
		pre := topo.inNode("iptables", "-t", "mangle", "-S", "PREROUTING")
		if lines := strings.Split(strings.TrimSpace(pre), "\n"); len(lines) != 3 || lines[1] != "-A PREROUTING -j "+Chain {
			t.Errorf("PREROUTING:\n%s", pre)
		}
		resync(podA, podA6, podB, podA)
		if got := strings.Count(listing(), "-A "+Chain+" "); got != 4 {
			t.Errorf("%d rules for pods A and B, want 4:\n%s", got, listing())
		}
		// Pod B's DNS now goes through the proxy.
		seen := len(hooks.seen())
		if _, err := lookup(topo.bNS, "udp", resolver, "a.example.", dns.TypeA, 0); err != nil {
			t.Fatal(err)
		}
		if len(hooks.seen()) != seen+1 {
			t.Error("pod B's query did not reach the hook")
		}
		// IPv4 only: the IPv6 rules and routing go.
		resync(podA)
		if out := topo.inNode("ip6tables", "-t", "mangle", "-S"); strings.Contains(out, Chain) {
			t.Errorf("IPv6 rules left:\n%s", out)
		}
		if out := topo.inNode("ip", "-6", "rule"); strings.Contains(out, "0x4000") {
			t.Errorf("IPv6 rule left:\n%s", out)
		}
		resync(podA, podA6)
		wantA(t, ask(t, "udp", resolver6, "a.example.", dns.TypeAAAA, 0), "2001:db8::1")
	})
	t.Run("stats", func(t *testing.T) {
		s := p.Stats()
		t.Logf("%+v", s)
		if s.Answers == 0 || s.Queries < s.Answers || s.Dropped[ReasonSend] != 0 || s.ServFail[ReasonAnswer] != 0 {
			t.Errorf("stats %+v", s)
		}
	})
	t.Run("fail closed", func(t *testing.T) {
		stop()
		before := len(hooks.seen())
		for _, c := range []struct{ network, server string }{{"udp", resolver}, {"tcp", resolver}, {"udp", resolver6}, {"tcp", resolver6}} {
			if m, err := lookup(topo.aNS, c.network, c.server, "a.example.", dns.TypeA, 0); err == nil {
				t.Errorf("%s to %s with the proxy stopped: answered %v", c.network, c.server, m)
			}
		}
		if len(hooks.seen()) != before {
			t.Error("the hook was called with the proxy stopped")
		}
		if _, err := lookup(topo.bNS, "udp", resolver, "a.example.", dns.TypeA, 0); err != nil {
			t.Errorf("pod B with the proxy stopped: %s", err)
		}
	})
	t.Run("close removes everything", func(t *testing.T) {
		if err := inNS(topo, r.Close); err != nil {
			t.Fatal(err)
		}
		for _, tool := range []string{"iptables", "ip6tables"} {
			if out := topo.inNode(tool, "-t", "mangle", "-S"); strings.Contains(out, Chain) {
				t.Errorf("%s -t mangle -S:\n%s", tool, out)
			}
		}
		for _, family := range []string{"-4", "-6"} {
			if out := topo.inNode("ip", family, "rule"); strings.Contains(out, "0x4000") || strings.Contains(out, "4053") {
				t.Errorf("ip %s rule:\n%s", family, out)
			}
			if out := topo.inNode("ip", family, "route", "show", "table", "4053"); strings.TrimSpace(out) != "" {
				t.Errorf("ip %s route show table 4053:\n%s", family, out)
			}
		}
		if err := inNS(topo, r.Close); err != nil {
			t.Errorf("Close again: %s", err)
		}
		// Without the redirect pod A asks the resolver directly.
		if _, err := lookup(topo.aNS, "udp", resolver, "a.example.", dns.TypeA, 0); err != nil {
			t.Errorf("pod A without the redirect: %s", err)
		}
	})
}

// TestPrivilegedBadChecksumDropped: the pod's kernel verifies the UDP
// checksums of what the raw reply socket sends over the veth (a datagram
// with a bad checksum is dropped, the same with a good one arrives), so
// the answers that reach the pods in TestPrivilegedProxy carry good ones.
func TestPrivilegedBadChecksumDropped(t *testing.T) {
	topo := newTopology(t)
	from := netip.MustParseAddrPort(resolver + ":53")
	got := make(chan string, 2)
	var to netip.AddrPort
	err := inNSOf(topo.aNS, func() error {
		c, err := listenPodUDP()
		if err != nil {
			return err
		}
		t.Cleanup(func() { c.Close() })
		to = c.LocalAddr()
		go func() {
			buf := make([]byte, 64)
			for {
				n, _, err := c.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				got <- string(buf[:n])
			}
		}()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var rs *replySocket
	if err := inNS(topo, func() (err error) { rs, err = listenReply(t.Context(), false); return err }); err != nil {
		t.Fatal(err)
	}
	defer rs.Close()

	bad := append(make([]byte, udpHeaderLen), "bad"...)
	putUDPHeader(bad, from, to)
	bad[7] ^= 0xff
	if _, _, err := rs.conn.WriteMsgIP(bad, controlSrc(from.Addr()), udpAddrIP(to)); err != nil {
		t.Fatal(err)
	}
	good := append(make([]byte, udpHeaderLen), "good"...)
	if err := rs.send(good, from, to); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "good" {
			t.Errorf("got %q first", s)
		}
	case <-time.After(time.Second):
		t.Fatal("the good datagram did not arrive")
	}
	select {
	case s := <-got:
		t.Errorf("then %q: a bad checksum was not dropped", s)
	case <-time.After(100 * time.Millisecond):
	}
}
