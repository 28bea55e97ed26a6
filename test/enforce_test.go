package test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"

	"github.com/enimasq/enimasq/cells/celltest"
)

// TestPrivilegedNetworkPolicyIsEnforced runs the e2e cases as traffic
// between a pod behind a veth (and one behind an eni*-named device, as the
// AWS VPC CNI names them) and a peer: each outcome is the verdict
// program's for the same packet, and the replies of allowed connections
// pass the other way while that way is isolated.
func TestPrivilegedNetworkPolicyIsEnforced(t *testing.T) {
	node := newPolicyNode(t)
	node.addPod("a", "enim0a1b2c3d", podA)
	node.addPod("b", "eni4f3e2d1c0b", podB)

	a, dir := node.startAgent(map[string]string{"b": policyEndpoint("b", podB, []string{"Ingress"}, nil, nil)})

	run := func(from string, p probe) bool {
		switch p.proto {
		case "tcp":
			if p.dir == "egress" {
				return node.connect(from, policyPeerIP, p.port)
			}
			return node.connect(node.peerNS(), podA, p.port)
		case "udp":
			if p.dir == "egress" {
				return node.udp(from, policyPeerIP, p.port)
			}
			return node.udp(node.peerNS(), podA, p.port)
		}
		if p.dir == "egress" {
			return node.ping(from, policyPeerIP)
		}
		return node.ping(node.peerNS(), podA)
	}
	verdict := func(p probe) string {
		pod, peer := podA, policyPeerIP
		args := []string{"policy", "verdict", "--bpf-root", a.BPFRoot, "--pod", pod, "--direction", p.dir, "--peer", peer, "--proto", p.proto}
		if p.proto != "icmp" {
			args = append(args, "--port", fmt.Sprint(p.port))
		}
		out, _, _ := a.Dbg(args...)
		return out
	}

	waitAttached(a, 2) // both pods' devices, a's before any policy selects it
	for _, tc := range policyCases {
		t.Run(tc.name, func(t *testing.T) {
			WriteFileAtomic(t, filepath.Join(dir, "a.yaml"), policyEndpoint("a", podA, tc.isolation, tc.ingress, tc.egress))
			verdicts := make([]string, len(tc.probes))
			deadline := time.Now().Add(10 * time.Second)
			for {
				programmed := true
				for i, p := range tc.probes {
					if verdicts[i] == "" || strings.HasPrefix(verdicts[i], "ALLOW") != p.allow {
						verdicts[i] = verdict(p)
					}
					programmed = programmed && strings.HasPrefix(verdicts[i], "ALLOW") == p.allow
				}
				if programmed || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			for i, p := range tc.probes {
				if got := run(node.podNS("a"), p); got != strings.HasPrefix(verdicts[i], "ALLOW") || got != p.allow {
					t.Errorf("%s: traffic passed=%t; the verdict program: %s; want allow=%t", p, got, strings.TrimSpace(verdicts[i]), p.allow)
				}
			}
			// Pod b stays isolated for ingress, whatever a's policy.
			if node.connect(node.peerNS(), podB, 80) {
				t.Error("pod b (eni* device, default-deny ingress) was reached")
			}
			if !node.connect(node.podNS("b"), policyPeerIP, 80) {
				t.Error("pod b could not reach the peer (egress is not isolated; the reply is tracked)")
			}
		})
	}
}

// The programs stay on the pod's device as the device and the agent come
// and go: a device made again is enforcing within 2 s, a program detached
// by hand is back within 2 s, and across an agent's kill -9 and restart no
// packet the policy denies passes.
func TestPrivilegedNetworkPolicyEnforcementSurvives(t *testing.T) {
	node := newPolicyNode(t)
	const device = "eni0a0b0c0d0e"
	node.addPod("a", device, podA)
	a, _ := node.startAgent(map[string]string{"a": policyEndpoint("a", podA, []string{"Ingress"}, nil, nil)})

	reached := func() bool { return node.connect(node.peerNS(), podA, 80) }
	enforcingWithin := func(what string, d time.Duration) {
		t.Helper()
		start := time.Now()
		for reached() {
			if time.Since(start) > d {
				t.Fatalf("%s: the pod is still reached after %s", what, d)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("%s: enforcing after %s", what, time.Since(start).Round(time.Millisecond))
	}
	enforcingWithin("start", 10*time.Second)
	if !node.connect(node.podNS("a"), policyPeerIP, 80) {
		t.Fatal("the pod cannot reach the peer: its egress is not isolated")
	}

	node.recreatePod("a", device, podA)
	enforcingWithin("device made again", 2*time.Second)

	for _, side := range []string{"ingress", "egress"} {
		pin := filepath.Join(a.BPFRoot, "enimasq", "links", device+"_"+side)
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			t.Fatalf("the pinned link %s: %v", pin, err)
		}
		if err := l.Detach(); err != nil {
			t.Fatalf("detach %s: %v", pin, err)
		}
		l.Close()
	}
	enforcingWithin("programs detached by hand", 2*time.Second)

	// Kill -9 and restart while the peer keeps trying.
	leaked := countReachedUntil(reached)
	ns := a.NetNS()
	a.Kill9()
	time.Sleep(500 * time.Millisecond) // some tries with no agent at all
	a.StartInNetNS(ns)
	a.WaitHealthy()
	waitAttached(a, 1)
	if n := leaked(); n > 0 {
		t.Errorf("%d connections the policy denies passed during the restart", n)
	}
	enforcingWithin("after the restart", time.Second)

	// Network policy turned off: the next start takes the programs off.
	a.Kill9()
	a.Args = slices.DeleteFunc(a.Args, func(arg string) bool { return arg == "--enable-network-policy" })
	a.StartInNetNS(ns)
	a.WaitHealthy()
	a.WaitFor("the pinned links removed", func() bool {
		entries, _ := os.ReadDir(filepath.Join(a.BPFRoot, "enimasq", "links"))
		return len(entries) == 0
	})
	a.WaitFor("the pod reached again", reached)
}

// In strict mode a pod that no policy selects has no traffic, and one
// whose policy is in the kernel has what its policy allows.
func TestPrivilegedNetworkPolicyStrictMode(t *testing.T) {
	node := newPolicyNode(t)
	node.addPod("a", "enim1a1a1a1a", podA)
	node.addPod("b", "enim2b2b2b2b", podB)
	a, _ := node.startAgent(map[string]string{"b": policyEndpoint("b", podB, []string{"Ingress"},
		[]peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}}}, nil)}, "--network-policy-enforcing-mode=strict")
	waitAttached(a, 2)
	if node.connect(node.peerNS(), podA, 80) || node.connect(node.podNS("a"), policyPeerIP, 80) {
		t.Error("strict mode: pod a, which no policy selects, has traffic")
	}
	if !node.connect(node.peerNS(), podB, 80) {
		t.Error("strict mode: pod b's policy allows TCP 80 from the peer")
	}
	if node.connect(node.peerNS(), podB, 81) {
		t.Error("strict mode: pod b's policy allows only TCP 80")
	}
	if !node.connect(node.podNS("b"), policyPeerIP, 443) {
		t.Error("strict mode: pod b's egress is not isolated by its policy")
	}
}

// Where the kernel has no tcx, the programs are tc filters on a clsact
// qdisc (--network-policy-attach=tc here): enforcing, and put back when
// someone deletes them.
func TestPrivilegedNetworkPolicyTCFallback(t *testing.T) {
	node := newPolicyNode(t)
	const device = "enim3c3c3c3c"
	node.addPod("a", device, podA)
	a, _ := node.startAgent(map[string]string{"a": policyEndpoint("a", podA, []string{"Ingress"}, nil, nil)}, "--network-policy-attach=tc")
	waitAttached(a, 1)
	if out := run(t, "ip", "netns", "exec", node.Node, "tc", "filter", "show", "dev", device, "egress"); !strings.Contains(out, "enimasq-policy") {
		t.Fatalf("no enimasq tc filter on the egress of %s:\n%s", device, out)
	}
	if node.connect(node.peerNS(), podA, 80) {
		t.Fatal("the pod is reached: its ingress is isolated")
	}
	if !node.connect(node.podNS("a"), policyPeerIP, 80) {
		t.Fatal("the pod cannot reach the peer (the reply is tracked)")
	}
	run(t, "ip", "netns", "exec", node.Node, "tc", "filter", "del", "dev", device, "egress")
	start := time.Now()
	for node.connect(node.peerNS(), podA, 80) {
		if time.Since(start) > 2*time.Second {
			t.Fatal("the tc filter deleted by hand is not back after 2 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// What a pod sends must come from one of its own addresses: a pod that
// forges another pod's address, or one no pod has, is not judged by that
// address's policy (or by none, which allows), but dropped.
func TestPrivilegedNetworkPolicyRefusesForgedSources(t *testing.T) {
	node := newPolicyNode(t)
	node.addPod("a", "enim4d4d4d4d", podA)
	node.addPod("b", "enim5e5e5e5e", podB)
	// a may send only to the node; b anything anywhere.
	a, _ := node.startAgent(map[string]string{
		"a": policyEndpoint("a", podA, []string{"Egress"}, nil, []peRule{{cidr: policyNodeIP + "/32"}}),
		"b": policyEndpoint("b", podB, []string{"Egress"}, nil, []peRule{{cidr: "0.0.0.0/0"}}),
	})
	waitAttached(a, 2)

	// The peer counts what reaches it on UDP 9999.
	var received atomic.Int64
	if err := celltest.InNS(node.ns[node.peerNS()], func() error {
		c, err := net.ListenPacket("udp4", policyPeerIP+":9999")
		if err != nil {
			return err
		}
		t.Cleanup(func() { c.Close() })
		go func() {
			buf := make([]byte, 64)
			for {
				if _, _, err := c.ReadFrom(buf); err != nil {
					return
				}
				received.Add(1)
			}
		}()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	send := func(from string) {
		t.Helper()
		err := celltest.InNS(node.ns[node.podNS("a")], func() error {
			c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(from)}, &net.UDPAddr{IP: net.ParseIP(policyPeerIP), Port: 9999})
			if err != nil {
				return err
			}
			defer c.Close()
			for range 5 {
				if _, err := c.Write([]byte("x")); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("send from %s: %v", from, err)
		}
	}
	// Pod a takes b's address and one no pod has.
	run(t, "ip", "-n", node.podNS("a"), "addr", "add", podB+"/32", "dev", "eth0")
	run(t, "ip", "-n", node.podNS("a"), "addr", "add", "10.0.0.99/32", "dev", "eth0")
	send(podB)
	send("10.0.0.99")
	// b itself may send: the peer receives (and so would have received
	// a's forged datagrams, had they passed).
	if err := celltest.InNS(node.ns[node.podNS("b")], func() error {
		c, err := net.Dial("udp4", policyPeerIP+":9999")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for received.Load() < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := received.Load(); n != 1 {
		t.Errorf("the peer received %d datagrams, want 1 (b's own; none of a's forged ones)", n)
	}
	if v, _, _ := a.Dbg("policy", "verdict", "--bpf-root", a.BPFRoot, "--pod", podA, "--direction", "egress",
		"--peer", policyPeerIP, "--proto", "udp", "--port", "9999"); !strings.HasPrefix(v, "DENY") {
		t.Errorf("a's own datagram to the peer: %s, want DENY (a may send only to the node)", v)
	}
}

// IPv6 as traffic: a dual-stack pod whose policy isolates both families'
// ingress and allows TCP 80 from the peer's IPv6 address only; neighbour
// discovery keeps working under the programs.
func TestPrivilegedNetworkPolicyIPv6(t *testing.T) {
	node := newPolicyNode(t)
	node.addPod("a", "enim6a6a6a6a", podA)
	node.enableIPv6("a", "enim6a6a6a6a")

	// v6 servers in the pod and the peer.
	for ns, ip := range map[string]string{node.podNS("a"): pod6, node.peerNS(): peer6} {
		if err := celltest.InNS(node.ns[ns], func() error {
			for _, port := range []int{80, 81} {
				if err := answerOK(t, "tcp6", net.JoinHostPort(ip, strconv.Itoa(port))); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	connect6 := func(from, dst string, port int) bool {
		var ok bool
		celltest.InNS(node.ns[from], func() error {
			c, err := net.DialTimeout("tcp6", net.JoinHostPort(dst, strconv.Itoa(port)), time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Second))
			buf := make([]byte, 2)
			_, err = c.Read(buf)
			ok = err == nil && string(buf) == "ok"
			return nil
		})
		return ok
	}
	if !connect6(node.peerNS(), pod6, 80) {
		t.Fatal("IPv6 does not work between the peer and the pod without the agent")
	}

	pe := policyEndpoint("a", podA, []string{"Ingress"}, []peRule{{cidr: peer6 + "/128", ports: []string{"TCP 80"}}}, nil)
	pe = strings.Replace(pe, "  podSelectorEndpoints:\n", "  podSelectorEndpoints:\n  - {podIP: \""+pod6+"\", hostIP: "+policyNodeIP+", name: a, namespace: e2e}\n", 1)
	a, _ := node.startAgent(map[string]string{"a": pe}, "--enable-ipv6")
	waitAttached(a, 1)
	deadline := time.Now().Add(5 * time.Second)
	for connect6(node.peerNS(), pod6, 81) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if connect6(node.peerNS(), pod6, 81) {
		t.Error("IPv6 TCP 81 from the peer reached the pod: only TCP 80 is allowed")
	}
	if !connect6(node.peerNS(), pod6, 80) {
		t.Error("IPv6 TCP 80 from the peer did not reach the pod (neighbour discovery, or the policy)")
	}
	if !connect6(node.podNS("a"), peer6, 81) {
		t.Error("the pod's IPv6 egress is not isolated, and its replies are tracked")
	}
	if node.connect(node.peerNS(), podA, 80) {
		t.Error("IPv4 TCP 80 reached the pod: its IPv4 ingress is isolated with no rule")
	}
}

// On pods that enimasq-cni itself wired (its veths, routes and rules, from
// the ENI IPAM of the sample CiliumNode), the policy of a PolicyEndpoint
// selecting one pod is enforced between the two.
func TestPrivilegedNetworkPolicyOnEnimasqCNIPods(t *testing.T) {
	topo := newVPCTopology(t)
	a, pes := cniPolicyAgent(t, topo)
	cni := newCNIRuntime(t, topo, a.APISocket())
	nsA, nsB := cni.newPod("client"), cni.newPod("server")
	ipA, ipB := cni.add(nsA, "client"), cni.add(nsB, "server")
	hA, hB := nsHandle(t, nsA), nsHandle(t, nsB)
	for _, port := range []int{80, 81} {
		if err := celltest.InNS(hB, func() error { return answerOK(t, "tcp4", net.JoinHostPort(ipB, strconv.Itoa(port))) }); err != nil {
			t.Fatal(err)
		}
	}
	connect := func(port int) bool { return connectTCP(hA, ipB, port) }
	if !connect(80) || !connect(81) {
		t.Fatal("the CNI's pods do not reach each other without a policy")
	}

	// The server admits the client on TCP 80 only.
	pe := policyEndpoint("server", ipB, []string{"Ingress"}, []peRule{{cidr: ipA + "/32", ports: []string{"TCP 80"}}}, nil)
	WriteFileAtomic(t, filepath.Join(pes, "server.yaml"), onCNINode(pe))
	waitAttached(a, 2) // both pods' devices carry the programs
	deadline := time.Now().Add(5 * time.Second)
	for connect(81) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if connect(81) {
		t.Error("the client reached the server's TCP 81: only TCP 80 is allowed")
	}
	if !connect(80) {
		t.Error("the client did not reach the server's TCP 80")
	}
	// The rows name the host-side veths that enimasq-cni made: every pod's
	// device carries the programs, the client's too (no policy selects
	// it: allowed, with its own source only).
	rows := a.MustDbg("shell", "--", "db/show", "policy-attachments")
	if !strings.Contains(rows, ipB) || !strings.Contains(rows, ipA) || strings.Count(rows, "Done") != 2 {
		t.Errorf("policy-attachments should hold both pods' devices, Done:\n%s", rows)
	}
}
