package test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
)

// The domain names of the tests: a resolver (CoreDNS) on the peer's
// subnet, and the peers the names stand for on a /24 the peer netns owns
// whole (a local route: every address answers).
const (
	fqdnResolver = "10.0.1.53"
	fqdnPeerNet  = "10.0.2.0/24"
	fqdnPort     = 8443 // what the name rule allows
	fqdnOtherTCP = 9080 // what it does not
	fqdnTTL      = 3    // seconds
	// fqdnNodeLocal is a node-local DNS cache's address, on the node.
	fqdnNodeLocal = "169.254.20.10"
)

// fqdnNode is a policy node whose peer netns also serves fqdnPeerNet on
// fqdnPort and fqdnOtherTCP, with CoreDNS at fqdnResolver answering
// records.
func fqdnNode(t testing.TB, records map[string][]string) (*policyNode, *coreDNS) {
	t.Helper()
	node := newPolicyNode(t)
	peer := node.peerNS()
	run(t, "ip", "-n", peer, "addr", "add", fqdnResolver+"/24", "dev", "eth0")
	run(t, "ip", "-n", peer, "route", "add", "local", fqdnPeerNet, "dev", "lo")
	run(t, "ip", "-n", node.Node, "route", "add", fqdnPeerNet, "via", policyPeerIP)
	if err := celltest.InNS(node.ns[peer], func() error {
		if err := answerOKThenEcho(t, net.JoinHostPort("0.0.0.0", strconv.Itoa(fqdnPort))); err != nil {
			return err
		}
		return answerOK(t, "tcp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(fqdnOtherTCP)))
	}); err != nil {
		t.Fatal(err)
	}
	return node, startCoreDNS(t, peer, fqdnResolver, records, fqdnTTL)
}

// answerOKThenEcho listens on addr (in the calling thread's netns) and
// answers every connection with "ok", then echoes what it reads until the
// peer closes (a connection that stays open), until the test ends.
func answerOKThenEcho(t testing.TB, addr string) error {
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		return err
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for c, err := l.Accept(); err == nil; c, err = l.Accept() {
			go func() {
				defer c.Close()
				c.Write([]byte("ok"))
				buf := make([]byte, 512)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					c.Write(buf[:n])
				}
			}()
		}
	}()
	return nil
}

// fqdnPolicy isolates a pod in egress, allowing DNS to the resolver and
// the names of pattern on TCP fqdnPort: the PolicyEndpoint the AWS
// controller writes for an ApplicationNetworkPolicy with domainNames (an
// entry with a domainName and no cidr).
func fqdnPolicy(name, pod, pattern string) string {
	return fmt.Sprintf(`apiVersion: networking.k8s.aws/v1alpha1
kind: PolicyEndpoint
metadata: {name: %[1]s, namespace: e2e}
spec:
  policyRef: {name: %[1]s, namespace: e2e}
  podIsolation: [Egress]
  podSelectorEndpoints:
  - {podIP: %[2]s, hostIP: %[3]s, name: %[1]s, namespace: e2e}
  egress:
  - cidr: %[4]s/32
    ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]
  - cidr: %[7]s/32
    ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]
  - domainName: %[5]q
    ports: [{protocol: TCP, port: %[6]d}]
`, name, pod, policyNodeIP, fqdnResolver, pattern, fqdnPort, fqdnNodeLocal)
}

// lookup asks the resolver for a name's A record from a pod, over network
// ("udp" or "tcp"), as a stub resolver does; it returns the addresses
// answered, or the error (a timeout, SERVFAIL).
func lookup(node *policyNode, pod, network, name string) ([]netip.Addr, error) {
	return lookupAt(node, pod, network, fqdnResolver, name)
}

// lookupAt is lookup of the resolver at server.
func lookupAt(node *policyNode, pod, network, server, name string) ([]netip.Addr, error) {
	var out []netip.Addr
	err := celltest.InNS(node.ns[node.podNS(pod)], func() error {
		c := &dns.Client{Net: network, Timeout: 2 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		m.SetEdns0(1232, false)
		r, _, err := c.Exchange(m, net.JoinHostPort(server, "53"))
		if err != nil {
			return err
		}
		if r.Rcode != dns.RcodeSuccess {
			return fmt.Errorf("%s: %s", name, dns.RcodeToString[r.Rcode])
		}
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				ip, _ := netip.AddrFromSlice(a.A.To4())
				out = append(out, ip)
			}
		}
		return nil
	})
	return out, err
}

// A pod that a domainName entry selects reaches what its lookups of
// matching names answered, on the entry's port, on the first try right
// after each lookup (200 names, each a new address: the answer waits until
// its address is in the kernel), over UDP and TCP and through a CNAME;
// not other names, other ports, addresses it was told only by a forged
// reply, or an address after its TTL (while a connection opened before
// lives on). A pod that no such entry selects asks its resolver directly.
// enimasq-dbg policy fqdn lists what was learnt and policy verdict names
// the name behind an allowed address.
func TestPrivilegedPolicyFQDN(t *testing.T) {
	records := map[string][]string{
		"www.other.org":     {"10.0.2.250"},
		"tcp.example.com":   {"10.0.2.201"},
		"alias.example.com": {"CNAME target.cdn.net."},
		"target.cdn.net":    {"10.0.2.240"},
		"example.com":       {"10.0.2.241"},
	}
	const rounds = 200
	for i := 1; i <= rounds; i++ {
		records[fmt.Sprintf("n%d.example.com", i)] = []string{fmt.Sprintf("10.0.2.%d", i)}
	}
	node, _ := fqdnNode(t, records)
	node.addPod("a", "enimfqdna001", podA)
	node.addPod("b", "enimfqdnb001", podB)
	pes := map[string]string{"a": fqdnPolicy("a", podA, "*.example.com")}
	a, _ := node.startAgent(pes)
	waitAttached(a, 2)

	// Before any lookup, nothing under the name is reached.
	if node.connect(node.podNS("a"), "10.0.2.1", fqdnPort) {
		t.Fatal("10.0.2.1 reached before any lookup")
	}
	for i := 1; i <= rounds; i++ {
		name, want := fmt.Sprintf("n%d.example.com", i), netip.MustParseAddr(fmt.Sprintf("10.0.2.%d", i))
		ips, err := lookup(node, "a", "udp", name)
		if err != nil || len(ips) != 1 || ips[0] != want {
			t.Fatalf("round %d: lookup %s: %v %v, want %s", i, name, ips, err, want)
		}
		if !node.connect(node.podNS("a"), want.String(), fqdnPort) {
			t.Fatalf("round %d: %s (%s) not reached right after its lookup", i, name, want)
		}
	}

	// Over TCP, and through a CNAME to another domain (the name asked is
	// what the pattern matches).
	for _, c := range []struct{ network, name, ip string }{{"tcp", "tcp.example.com", "10.0.2.201"}, {"udp", "alias.example.com", "10.0.2.240"}} {
		if ips, err := lookup(node, "a", c.network, c.name); err != nil || len(ips) != 1 || ips[0].String() != c.ip {
			t.Fatalf("lookup %s over %s: %v %v", c.name, c.network, ips, err)
		}
		if !node.connect(node.podNS("a"), c.ip, fqdnPort) {
			t.Errorf("%s (%s, over %s) not reached after its lookup", c.name, c.ip, c.network)
		}
	}

	// A node-local DNS cache on the node: its answers too.
	run(t, "ip", "-n", node.Node, "addr", "add", fqdnNodeLocal+"/32", "dev", "lo")
	startCoreDNS(t, node.Node, fqdnNodeLocal, map[string][]string{"local.example.com": {"10.0.2.230"}}, fqdnTTL)
	if ips, err := lookupAt(node, "a", "udp", fqdnNodeLocal, "local.example.com"); err != nil || len(ips) != 1 || ips[0].String() != "10.0.2.230" {
		t.Fatalf("lookup local.example.com of the node-local cache: %v %v", ips, err)
	}
	if !node.connect(node.podNS("a"), "10.0.2.230", fqdnPort) {
		t.Error("local.example.com (of the node-local cache) not reached after its lookup")
	}

	// Other names (answered: DNS is allowed) and other ports are denied.
	for _, name := range []string{"www.other.org", "example.com"} {
		ips, err := lookup(node, "a", "udp", name)
		if err != nil || len(ips) != 1 {
			t.Fatalf("lookup %s: %v %v", name, ips, err)
		}
		if node.connect(node.podNS("a"), ips[0].String(), fqdnPort) {
			t.Errorf("%s (%s) reached: the pattern does not match it", name, ips[0])
		}
	}
	if node.connect(node.podNS("a"), "10.0.2.1", fqdnOtherTCP) {
		t.Errorf("n1.example.com reached on port %d, which the entry does not allow", fqdnOtherTCP)
	}

	// A forged reply (from the resolver's address and from another pod,
	// to the port the pod asks from) teaches nothing.
	forged := func(from, port string) {
		m := new(dns.Msg)
		m.SetQuestion("forged.example.com.", dns.TypeA)
		m.Response = true
		rr, _ := dns.NewRR("forged.example.com. 300 IN A 10.0.2.251")
		m.Answer = []dns.RR{rr}
		b, _ := m.Pack()
		ns := node.ns[node.peerNS()]
		if from == podB {
			ns = node.ns[node.podNS("b")]
		}
		if err := celltest.InNS(ns, func() error {
			// Port 53 of the resolver's address is CoreDNS's (and the
			// pods' their echo's): share it.
			lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
				return rc.Control(func(fd uintptr) {
					syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1)
				})
			}}
			c, err := lc.ListenPacket(context.Background(), "udp4", net.JoinHostPort(from, port))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.WriteTo(b, &net.UDPAddr{IP: net.ParseIP(podA), Port: 53000})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	forged(fqdnResolver, "53")
	forged(podB, "5353")
	if node.connect(node.podNS("a"), "10.0.2.251", fqdnPort) {
		t.Error("an address only a forged reply gave is reached")
	}

	// What was learnt, and the name behind an allowed address.
	out := a.MustDbg("policy", "fqdn", "--pod", podA)
	for _, want := range []string{"n1.example.com", "n200.example.com", "tcp.example.com", "alias.example.com", "10.0.2.240", "e2e/a"} {
		if !strings.Contains(out, want) {
			t.Errorf("policy fqdn does not list %s:\n%.3000s", want, out)
		}
	}
	if strings.Contains(out, "forged") || strings.Contains(out, "other.org") {
		t.Errorf("policy fqdn lists a name no rule matched or a forged answer:\n%.3000s", out)
	}
	if v := a.MustDbg("policy", "verdict", "--pod", podA, "--peer", "10.0.2.201", "--proto", "tcp", "--port", strconv.Itoa(fqdnPort)); !strings.HasPrefix(v, "ALLOW") || !strings.Contains(v, "fqdn: tcp.example.com") {
		t.Errorf("policy verdict does not name the name behind the address: %s", v)
	}
	m := agentMetrics(t, a)
	if m["enimasq_policy_fqdn_lookups_total"] < rounds || m["enimasq_policy_fqdn_answer_to_kernel_seconds_count,outcome=applied"] < rounds {
		t.Errorf("metrics: %v", m)
	}

	// Pod b: no entry selects it, its lookups go to the resolver directly.
	before := agentMetrics(t, a)["enimasq_policy_fqdn_lookups_total"]
	if ips, err := lookup(node, "b", "udp", "n1.example.com"); err != nil || len(ips) != 1 {
		t.Fatalf("pod b's lookup: %v %v", ips, err)
	}
	if after := agentMetrics(t, a)["enimasq_policy_fqdn_lookups_total"]; after != before {
		t.Errorf("pod b's lookup went through the proxy (lookups %g -> %g)", before, after)
	}

	// Expiry: learn n1 again, open a connection that stays, and wait out
	// the TTL: a new connection is denied, the open one lives on.
	if _, err := lookup(node, "a", "udp", "n1.example.com"); err != nil {
		t.Fatal(err)
	}
	var held net.Conn
	if err := celltest.InNS(node.ns[node.podNS("a")], func() error {
		c, err := net.DialTimeout("tcp4", "10.0.2.1:"+strconv.Itoa(fqdnPort), probeTimeout)
		held = c
		return err
	}); err != nil {
		t.Fatalf("connect to n1 after its lookup: %s", err)
	}
	defer held.Close()
	a.WaitFor("n1.example.com to expire", func() bool {
		return !strings.Contains(a.MustDbg("policy", "fqdn", "--pod", podA), "n1.example.com ")
	})
	if node.connect(node.podNS("a"), "10.0.2.1", fqdnPort) {
		t.Error("n1.example.com reached after its TTL")
	}
	held.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(held, buf[:2]); err != nil || string(buf[:2]) != "ok" {
		t.Fatalf("the connection opened before the expiry: %q %v", buf, err)
	}
	if _, err := held.Write([]byte("live")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(held, buf); err != nil || string(buf) != "live" {
		t.Errorf("the connection opened before the expiry does not live on: %q %v", buf, err)
	}
}

// Fail closed: with the agent gone (its redirect left in place) the
// selected pod's lookups fail, over UDP and TCP, and it reaches nothing
// new; a lookup the proxy cannot serve (the resolver the pod asks does
// not answer) gets SERVFAIL, and health names it. Started again, the agent
// serves the lookups at once.
func TestPrivilegedPolicyFQDNFailClosed(t *testing.T) {
	records := map[string][]string{"n1.example.com": {"10.0.2.1"}, "n2.example.com": {"10.0.2.2"}, "n3.example.com": {"10.0.2.3"}}
	node, _ := fqdnNode(t, records)
	node.addPod("a", "enimfqdnfa01", podA)
	// DNS to the peer's whole subnet: 10.0.1.54 answers nothing.
	pe := strings.Replace(fqdnPolicy("a", podA, "*.example.com"), fqdnResolver+"/32", "10.0.1.0/24", 1)
	a, _ := node.startAgent(map[string]string{"a": pe}, "--tofqdns-min-ttl=3600")
	waitAttached(a, 1)
	if _, err := lookup(node, "a", "udp", "n1.example.com"); err != nil {
		t.Fatal(err)
	}

	// A resolver that does not answer: SERVFAIL (after the proxy's
	// timeout), and health says why.
	err := celltest.InNS(node.ns[node.podNS("a")], func() error {
		c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion("n2.example.com.", dns.TypeA)
		r, _, err := c.Exchange(m, "10.0.1.54:53")
		if err != nil {
			return err
		}
		if r.Rcode != dns.RcodeServerFailure {
			return fmt.Errorf("rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
		}
		return nil
	})
	if err != nil {
		t.Fatalf("a lookup of a resolver that does not answer: %s", err)
	}
	a.WaitFor("health to name the failed lookups", func() bool {
		out, _, _ := a.Dbg("status", "--verbose")
		return strings.Contains(out, "DNS proxy failed lookups") && strings.Contains(out, "upstream 1")
	})
	if node.connect(node.podNS("a"), "10.0.2.2", fqdnPort) {
		t.Error("n2.example.com reached: its lookup failed")
	}

	// The redirect flushed by hand: checked against the kernel, it is put
	// back.
	run(t, "ip", "netns", "exec", node.Node, "iptables", "-w", "-t", "mangle", "-F", "ENIMASQ-DNS")
	a.WaitFor("the redirect put back", func() bool {
		return strings.Contains(run(t, "ip", "netns", "exec", node.Node, "iptables", "-w", "-t", "mangle", "-S", "ENIMASQ-DNS"), "TPROXY")
	})
	if ips, err := lookup(node, "a", "udp", "n2.example.com"); err != nil || len(ips) != 1 {
		t.Fatalf("after the redirect was put back: %v %v", ips, err)
	}
	if !node.connect(node.podNS("a"), "10.0.2.2", fqdnPort) {
		t.Error("after the redirect was put back n2.example.com is not reached after its lookup")
	}
	// The agent gone: lookups fail, nothing new is reached.
	ns := a.NetNS()
	a.Kill9()
	for _, network := range []string{"udp", "tcp"} {
		if ips, err := lookup(node, "a", network, "n3.example.com"); err == nil {
			t.Errorf("with the agent gone a lookup over %s was answered: %v", network, ips)
		}
	}
	if node.connect(node.podNS("a"), "10.0.2.3", fqdnPort) {
		t.Error("with the agent gone n3.example.com is reached")
	}

	// Back: what the pod was told before is still allowed (the agent's
	// checkpoint), and lookups are served at once.
	a.StartInNetNS(ns)
	a.WaitStarted()
	if !strings.Contains(a.Log(), "Restored the names the pods were told") {
		t.Error("the names were not restored")
	}
	if !node.connect(node.podNS("a"), "10.0.2.2", fqdnPort) {
		t.Error("after the restart n2.example.com, learnt before, is not reached")
	}
	a.WaitFor("the redirect to the new proxy", func() bool { return strings.Contains(a.Log(), "DNS redirect rules written") })
	if ips, err := lookup(node, "a", "udp", "n3.example.com"); err != nil || len(ips) != 1 {
		t.Fatalf("after the restart: %v %v", ips, err)
	}
	if !node.connect(node.podNS("a"), "10.0.2.3", fqdnPort) {
		t.Error("after the restart n3.example.com is not reached after its lookup")
	}
}

// 1,000 lookups a second from one pod, each of a new random name under
// the pattern (a flood), are all answered, and the memory they take is
// bounded: at most --policy-fqdn-max-names-per-pod rows, the rest dropped
// (counted), the agent's RSS within bounds.
func TestPrivilegedPolicyFQDNLookupRate(t *testing.T) {
	node, _ := fqdnNode(t, map[string][]string{"*.example.com": {"10.0.2.9"}})
	node.addPod("a", "enimfqdnra01", podA)
	const maxNames = 200
	a, _ := node.startAgent(map[string]string{"a": fqdnPolicy("a", podA, "*.example.com")},
		fmt.Sprintf("--policy-fqdn-max-names-per-pod=%d", maxNames), "--tofqdns-min-ttl=3600")
	waitAttached(a, 1)
	pid := a.cmd.Process.Pid
	before := celltest.ProcMemory(t, pid, "VmRSS")

	const rate, seconds, workers = 1000, 5, 4
	var failed, done atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			celltest.InNS(node.ns[node.podNS("a")], func() error {
				c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
				for i := w; i < rate*seconds; i += workers {
					if d := time.Until(start.Add(time.Duration(i) * time.Second / rate)); d > 0 {
						time.Sleep(d)
					}
					m := new(dns.Msg)
					m.SetQuestion(fmt.Sprintf("r%d-%d.example.com.", i, time.Now().UnixNano()), dns.TypeA)
					r, _, err := c.Exchange(m, net.JoinHostPort(fqdnResolver, "53"))
					if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
						failed.Add(1)
					}
					done.Add(1)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if got := float64(done.Load()) / took.Seconds(); got < 0.95*rate {
		t.Errorf("%d lookups in %v: %.0f a second, want %d", done.Load(), took, got, rate)
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d lookups failed", n, done.Load())
	}
	m := agentMetrics(t, a)
	if m["enimasq_policy_fqdn_ips_dropped_total"] < rate*seconds-maxNames-10 {
		t.Errorf("dropped %g addresses of %d names over the cap of %d", m["enimasq_policy_fqdn_ips_dropped_total"], rate*seconds, maxNames)
	}
	rows := 0
	for _, line := range strings.Split(a.MustDbg("shell", "--", "db/show", "policy-fqdn"), "\n") {
		if strings.HasPrefix(line, podA+" ") {
			rows++
		}
	}
	if rows > maxNames {
		t.Errorf("%d rows in policy-fqdn, the cap is %d", rows, maxNames)
	}
	grew := float64(int64(celltest.ProcMemory(t, pid, "VmRSS"))-int64(before)) / (1 << 20)
	t.Logf("%d lookups in %v, %d rows held, RSS grew %.1f MiB", done.Load(), took.Round(time.Millisecond), rows, grew)
	if grew > 64 {
		t.Errorf("the agent's RSS grew %.1f MiB under the flood", grew)
	}
	if !node.connect(node.podNS("a"), "10.0.2.9", fqdnPort) {
		t.Error("the flood's address is not reached")
	}
}
