package test

// ClusterPolicyEndpoints as traffic: each case of the tiers' order (the AWS
// agent v1.5.0's: Admin, NetworkPolicy, Baseline, default) with real TCP
// and UDP between pods behind veths and a peer, and the verdict program
// (enimasq-dbg policy verdict, the agent's loaded program) agreeing on each
// probe and naming the step and the object that decided. Every test fails
// on an agent that ignores ClusterPolicyEndpoints: each has a probe whose
// outcome only a ClusterPolicyEndpoint gives.

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/enimasq/enimasq/cells/celltest"
)

// cpeRule is an ingress or egress entry of a ClusterPolicyEndpoint.
type cpeRule struct {
	cidr   string
	ports  []string // "TCP 80", "UDP 53", "TCP 80-82", "UDP"; none: every protocol and port
	action string   // Accept, Deny, Pass
}

// clusterPolicyEndpoint is a ClusterPolicyEndpoint selecting pods (on the
// policy node), as the AWS network policy controller writes it for a
// ClusterNetworkPolicy.
func clusterPolicyEndpoint(name, tier string, priority int, pods []string, ingress, egress []cpeRule) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: networking.k8s.aws/v1alpha1\nkind: ClusterPolicyEndpoint\nmetadata: {name: %s}\n", name)
	fmt.Fprintf(&b, "spec:\n  policyRef: {name: %s}\n  tier: %s\n  priority: %d\n  podSelectorEndpoints:\n", name, tier, priority)
	for i, pod := range pods {
		fmt.Fprintf(&b, "  - {podIP: %s, hostIP: %s, name: pod-%d, namespace: e2e}\n", pod, policyNodeIP, i)
	}
	for _, dir := range []struct {
		name  string
		rules []cpeRule
	}{{"ingress", ingress}, {"egress", egress}} {
		if len(dir.rules) == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %s:\n", dir.name)
		for _, r := range dir.rules {
			fmt.Fprintf(&b, "  - cidr: %q\n    action: %s\n", r.cidr, r.action)
			if len(r.ports) > 0 {
				b.WriteString("    ports:\n")
				for _, p := range r.ports {
					proto, port, _ := strings.Cut(p, " ")
					start, end, ranged := strings.Cut(port, "-")
					fmt.Fprintf(&b, "    - {protocol: %s", proto)
					if start != "" {
						fmt.Fprintf(&b, ", port: %s", start)
					}
					if ranged {
						fmt.Fprintf(&b, ", endPort: %s", end)
					}
					b.WriteString("}\n")
				}
			}
		}
	}
	return b.String()
}

// Addresses of the cluster tests: the peer netns answers on policyPeerIP
// and on these (same subnet), so that rules can tell peers apart.
const (
	peerC2 = "10.0.1.3"
	peerC3 = "10.0.1.4"
	podC   = "10.0.0.5"
	podD   = "10.0.0.6"
)

// clusterNode is a policy node whose pods, peers and agent the cluster
// tests share.
type clusterNode struct {
	*policyNode
	pods  map[string]string // pod name -> IP
	agent *Agent
	dir   string // the policy-endpoints directory
}

// newClusterNode makes a policy node with the pods (name -> IP), the peer
// also at peerC2 and peerC3, and the node answering on policyNodeIP.
func newClusterNode(t *testing.T, pods map[string]string) *clusterNode {
	t.Helper()
	n := &clusterNode{policyNode: newPolicyNode(t), pods: pods}
	i := 0
	for name, ip := range pods {
		n.addPod(name, fmt.Sprintf("enic%x%s", i, strings.ReplaceAll(ip, ".", "")[4:]), ip)
		i++
	}
	for _, ip := range []string{peerC2, peerC3} {
		run(t, "ip", "-n", n.peerNS(), "addr", "add", ip+"/24", "dev", "eth0")
		n.serve(n.peerNS(), ip)
	}
	n.serve(n.Node, policyNodeIP)
	return n
}

// start starts the agent on the files (name without .yaml -> content) and
// waits until every pod's device carries the programs.
func (n *clusterNode) start(files map[string]string, extra ...string) {
	n.t.Helper()
	n.agent, n.dir = n.startAgent(files, extra...)
	waitAttached(n.agent, len(n.pods))
}

// write replaces (or adds) a file of the policy-endpoints directory;
// remove deletes it.
func (n *clusterNode) write(name, content string) {
	n.t.Helper()
	WriteFileAtomic(n.t, filepath.Join(n.dir, name+".yaml"), content)
}

func (n *clusterNode) remove(name string) {
	n.t.Helper()
	run(n.t, "rm", "-f", filepath.Join(n.dir, name+".yaml"))
}

// cprobe is one connection attempt between a pod and a peer: egress from
// the pod to peer, ingress from peer (an address of the peer netns, or the
// node IP from the node netns) to the pod. The verdict program must agree
// and name the deciding step and object: decider is the text between the
// packet and the reason of its verdict line ("admin
// ClusterPolicyEndpoint/x", "namespace PolicyEndpoint/e2e/a", "default",
// "admin node IP").
type cprobe struct {
	pod     string
	dir     string // egress, ingress
	proto   string // tcp, udp
	peer    string
	port    int
	allow   bool
	decider string
}

func (p cprobe) String() string {
	return fmt.Sprintf("%s %s %s %s/%d", p.pod, p.dir, p.peer, p.proto, p.port)
}

// srcNS is the netns a peer address is in.
func (n *clusterNode) srcNS(peer string) netns.NsHandle {
	if peer == policyNodeIP {
		return n.ns[n.Node]
	}
	return n.ns[n.peerNS()]
}

// try runs a probe as traffic: whether the answer came back.
func (n *clusterNode) try(p cprobe) bool {
	podIP := n.pods[p.pod]
	if p.dir == "egress" {
		return dialFrom(n.ns[n.podNS(p.pod)], p.proto, "", p.peer, p.port)
	}
	return dialFrom(n.srcNS(p.peer), p.proto, p.peer, podIP, p.port)
}

// dialFrom says whether a TCP connection (the server's "ok") or a UDP
// datagram (its echo) from src (empty: the route's source) in ns to
// dst:port gets its answer.
func dialFrom(ns netns.NsHandle, proto, src, dst string, port int) bool {
	var ok bool
	celltest.InNS(ns, func() error {
		d := net.Dialer{Timeout: probeTimeout}
		if src != "" {
			if proto == "udp" {
				d.LocalAddr = &net.UDPAddr{IP: net.ParseIP(src)}
			} else {
				d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
			}
		}
		c, err := d.Dial(proto+"4", net.JoinHostPort(dst, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(probeTimeout))
		want := "ok"
		if proto == "udp" {
			want = "ping"
			if _, err := c.Write([]byte(want)); err != nil {
				return err
			}
		}
		buf := make([]byte, 8)
		k, err := c.Read(buf)
		ok = err == nil && string(buf[:k]) == want
		return nil
	})
	return ok
}

// verdict is the verdict program's line for the probe's packet.
func (n *clusterNode) verdict(p cprobe) string {
	out, errOut, err := n.agent.Dbg("policy", "verdict", "--pod", n.pods[p.pod], "--direction", p.dir, "--peer", p.peer,
		"--proto", p.proto, "--port", strconv.Itoa(p.port))
	if err != nil {
		return fmt.Sprintf("enimasq-dbg policy verdict: %v: %s%s", err, out, errOut)
	}
	return strings.TrimSpace(out)
}

// verdictAgrees says whether a verdict line is the probe's: ALLOW or DENY,
// and the deciding step and object.
func (p cprobe) verdictAgrees(line string) bool {
	want := "DENY "
	if p.allow {
		want = "ALLOW "
	}
	return strings.HasPrefix(line, want) && strings.Contains(line, ": "+p.decider+": ")
}

// expect waits (up to 10 s) until the verdict program gives every probe's
// verdict and decider, then runs each probe as traffic: both must be the
// probe's.
func (n *clusterNode) expect(t *testing.T, probes ...cprobe) {
	t.Helper()
	verdicts := make([]string, len(probes))
	deadline := time.Now().Add(10 * time.Second)
	for {
		done := true
		for i, p := range probes {
			if !p.verdictAgrees(verdicts[i]) {
				verdicts[i] = n.verdict(p)
			}
			done = done && p.verdictAgrees(verdicts[i])
		}
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, p := range probes {
		if !p.verdictAgrees(verdicts[i]) {
			t.Errorf("%s: the verdict program says %q, want %s by %q", p, verdicts[i], allowText(p.allow), p.decider)
		}
		if got := n.try(p); got != p.allow {
			t.Errorf("%s: traffic passed=%t, want %t (the verdict program: %s)", p, got, p.allow, verdicts[i])
		}
	}
}

func allowText(allow bool) string {
	if allow {
		return "ALLOW"
	}
	return "DENY"
}

// Admin Deny over a NetworkPolicy allow: pod a's PolicyEndpoint allows its
// egress to the peer subnet on TCP 80 and UDP 53; an Admin
// ClusterPolicyEndpoint denies TCP 80 to one peer address, which no
// NetworkPolicy rule can open again.
func TestPrivilegedClusterAdminDenyOverNetworkPolicyAllow(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA})
	n.start(map[string]string{
		"a": policyEndpoint("a", podA, []string{"Egress"}, nil, []peRule{{cidr: "10.0.1.0/24", ports: []string{"TCP 80", "UDP 53"}}}),
		"cpe": clusterPolicyEndpoint("deny-peer", "Admin", 10, []string{podA}, nil,
			[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}, action: "Deny"}}),
	})
	n.expect(t,
		cprobe{"a", "egress", "tcp", policyPeerIP, 80, false, "admin ClusterPolicyEndpoint/deny-peer"},
		cprobe{"a", "egress", "udp", policyPeerIP, 53, true, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "tcp", peerC2, 80, true, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 81, false, "namespace PolicyEndpoint/e2e/a"},
	)
}

// Admin Accept over NetworkPolicy isolation: pod a's PolicyEndpoint
// isolates both directions with no rule; an Admin ClusterPolicyEndpoint
// accepts TCP 80 from the peer and UDP 53 to it.
func TestPrivilegedClusterAdminAcceptOverIsolation(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA})
	n.start(map[string]string{
		"a": policyEndpoint("a", podA, []string{"Ingress", "Egress"}, nil, nil),
		"cpe": clusterPolicyEndpoint("ops", "Admin", 100, []string{podA},
			[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}, action: "Accept"}},
			[]cpeRule{{cidr: "10.0.1.0/24", ports: []string{"UDP 53"}, action: "Accept"}}),
	})
	n.expect(t,
		cprobe{"a", "ingress", "tcp", policyPeerIP, 80, true, "admin ClusterPolicyEndpoint/ops"},
		cprobe{"a", "ingress", "tcp", policyPeerIP, 81, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "ingress", "tcp", peerC2, 80, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "udp", peerC2, 53, true, "admin ClusterPolicyEndpoint/ops"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 53, false, "namespace PolicyEndpoint/e2e/a"},
	)
}

// A Pass at a lower number than a Deny hands the packet over: to the
// NetworkPolicy for pod a (isolated in egress, TCP 80 to the peer
// allowed), to the default for pod b (no PolicyEndpoint). What the Pass
// does not match, the Deny denies.
func TestPrivilegedClusterPassHandsOver(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA, "b": podB})
	n.start(map[string]string{
		"a": policyEndpoint("a", podA, []string{"Egress"}, nil, []peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}}}),
		"cpes": clusterPolicyEndpoint("pass-web", "Admin", 5, []string{podA, podB}, nil,
			[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80-81"}, action: "Pass"}}) + "---\n" +
			clusterPolicyEndpoint("deny-subnet", "Admin", 10, []string{podA, podB}, nil,
				[]cpeRule{{cidr: "10.0.1.0/24", action: "Deny"}}),
	})
	n.expect(t,
		cprobe{"a", "egress", "tcp", policyPeerIP, 80, true, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 81, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 443, false, "admin ClusterPolicyEndpoint/deny-subnet"},
		cprobe{"b", "egress", "tcp", policyPeerIP, 80, true, "default"},
		cprobe{"b", "egress", "tcp", policyPeerIP, 81, true, "default"},
		cprobe{"b", "egress", "tcp", policyPeerIP, 443, false, "admin ClusterPolicyEndpoint/deny-subnet"},
		cprobe{"b", "egress", "udp", peerC2, 53, false, "admin ClusterPolicyEndpoint/deny-subnet"},
	)
}

// A tie at one priority: Deny wins over Accept, whichever object's name
// sorts first; an Accept alone at that priority accepts.
func TestPrivilegedClusterTieDenyWins(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA})
	n.start(map[string]string{
		"a": policyEndpoint("a", podA, []string{"Egress"}, nil, nil),
		"cpes": clusterPolicyEndpoint("a-accept", "Admin", 20, []string{podA}, nil, []cpeRule{
			{cidr: policyPeerIP + "/32", ports: []string{"TCP 80", "TCP 81"}, action: "Accept"},
			{cidr: "10.0.1.0/24", ports: []string{"UDP 53"}, action: "Deny"},
		}) + "---\n" + clusterPolicyEndpoint("z-deny", "Admin", 20, []string{podA}, nil, []cpeRule{
			{cidr: "10.0.1.0/24", ports: []string{"TCP 80"}, action: "Deny"},
			{cidr: policyPeerIP + "/32", ports: []string{"UDP 53"}, action: "Accept"},
		}),
	})
	n.expect(t,
		cprobe{"a", "egress", "tcp", policyPeerIP, 80, false, "admin ClusterPolicyEndpoint/z-deny"},
		cprobe{"a", "egress", "udp", policyPeerIP, 53, false, "admin ClusterPolicyEndpoint/a-accept"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 81, true, "admin ClusterPolicyEndpoint/a-accept"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 82, false, "namespace PolicyEndpoint/e2e/a"},
	)
}

// The Baseline tier decides for a pod no NetworkPolicy isolates in the
// direction (b: no PolicyEndpoint; c: one that isolates only its ingress),
// not for one a NetworkPolicy isolates (a, whose PolicyEndpoint allows TCP
// 80 to the peer).
func TestPrivilegedClusterBaselineOnlyWithoutIsolation(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA, "b": podB, "c": podC})
	n.start(map[string]string{
		"a": policyEndpoint("a", podA, []string{"Egress"}, nil, []peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}}}),
		"c": policyEndpoint("c", podC, []string{"Ingress"}, []peRule{{cidr: "0.0.0.0/0"}}, nil),
		"cpe": clusterPolicyEndpoint("baseline", "Baseline", 5, []string{podA, podB, podC}, nil, []cpeRule{
			{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}, action: "Deny"},
			{cidr: peerC2 + "/32", ports: []string{"UDP 53"}, action: "Accept"},
		}),
	})
	n.expect(t,
		cprobe{"a", "egress", "tcp", policyPeerIP, 80, true, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "udp", peerC2, 53, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"b", "egress", "tcp", policyPeerIP, 80, false, "baseline ClusterPolicyEndpoint/baseline"},
		cprobe{"b", "egress", "udp", peerC2, 53, true, "baseline ClusterPolicyEndpoint/baseline"},
		cprobe{"b", "egress", "tcp", policyPeerIP, 81, true, "default"},
		cprobe{"c", "egress", "tcp", policyPeerIP, 80, false, "baseline ClusterPolicyEndpoint/baseline"},
		cprobe{"c", "ingress", "tcp", policyPeerIP, 80, true, "namespace PolicyEndpoint/e2e/c"},
	)
}

// Ingress with the priorities of two objects swapped in place: the file is
// rewritten so that the Accept of the peer and the Deny of its subnet
// trade priorities, and the verdict flips with no restart.
func TestPrivilegedClusterIngressPrioritiesSwapped(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA})
	tiers := func(acceptPrio, denyPrio int) string {
		return clusterPolicyEndpoint("allow-peer", "Admin", acceptPrio, []string{podA},
			[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80", "UDP 53"}, action: "Accept"}}, nil) + "---\n" +
			clusterPolicyEndpoint("deny-subnet", "Admin", denyPrio, []string{podA},
				[]cpeRule{{cidr: "10.0.1.0/24", action: "Deny"}}, nil)
	}
	n.start(map[string]string{"tiers": tiers(10, 20)})
	pid := n.agent.cmd.Process.Pid
	n.expect(t,
		cprobe{"a", "ingress", "tcp", policyPeerIP, 80, true, "admin ClusterPolicyEndpoint/allow-peer"},
		cprobe{"a", "ingress", "udp", policyPeerIP, 53, true, "admin ClusterPolicyEndpoint/allow-peer"},
		cprobe{"a", "ingress", "tcp", policyPeerIP, 81, false, "admin ClusterPolicyEndpoint/deny-subnet"},
		cprobe{"a", "ingress", "tcp", peerC2, 80, false, "admin ClusterPolicyEndpoint/deny-subnet"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 80, true, "default"},
	)
	n.write("tiers", tiers(20, 10))
	n.expect(t,
		cprobe{"a", "ingress", "tcp", policyPeerIP, 80, false, "admin ClusterPolicyEndpoint/deny-subnet"},
		cprobe{"a", "ingress", "udp", policyPeerIP, 53, false, "admin ClusterPolicyEndpoint/deny-subnet"},
		cprobe{"a", "ingress", "tcp", policyPeerIP, 81, false, "admin ClusterPolicyEndpoint/deny-subnet"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 80, true, "default"},
	)
	n.write("tiers", tiers(10, 20))
	n.expect(t, cprobe{"a", "ingress", "tcp", policyPeerIP, 80, true, "admin ClusterPolicyEndpoint/allow-peer"})
	if got := n.agent.cmd.Process.Pid; got != pid {
		t.Errorf("the agent was restarted (pid %d, then %d)", pid, got)
	}
	select {
	case <-n.agent.exited:
		t.Errorf("the agent exited: %v", n.agent.err)
	default:
	}
}

// 30 port entries in one rule: an Admin Accept of 30 TCP ports (9001,
// 9003, ..., 9059) to the peer for a pod whose PolicyEndpoint denies all
// its egress. Exactly those ports are allowed: the first, the last and the
// others listed pass, a port between them that is not listed does not
// (traffic on some, the verdict program on every port of 9000-9060).
func TestPrivilegedClusterThirtyPorts(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA})
	var listed []string
	isListed := map[int]bool{}
	for i := range 30 {
		port := 9001 + 2*i
		listed = append(listed, fmt.Sprintf("TCP %d", port))
		isListed[port] = true
	}
	if err := celltest.InNS(n.ns[n.peerNS()], func() error {
		for port := 9000; port <= 9060; port++ {
			if err := answerOK(t, "tcp4", net.JoinHostPort(policyPeerIP, strconv.Itoa(port))); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	n.start(map[string]string{
		"a":   policyEndpoint("a", podA, []string{"Egress"}, nil, nil),
		"cpe": clusterPolicyEndpoint("ports", "Admin", 1, []string{podA}, nil, []cpeRule{{cidr: policyPeerIP + "/32", ports: listed, action: "Accept"}}),
	})
	// Traffic: the first, the last, one between not listed, and around.
	n.expect(t,
		cprobe{"a", "egress", "tcp", policyPeerIP, 9001, true, "admin ClusterPolicyEndpoint/ports"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 9059, true, "admin ClusterPolicyEndpoint/ports"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 9030, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 9031, true, "admin ClusterPolicyEndpoint/ports"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 9000, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 9060, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "udp", policyPeerIP, 53, false, "namespace PolicyEndpoint/e2e/a"},
	)
	// The verdict program on every port around the list, and traffic on
	// every listed one.
	for port := 9000; port <= 9060; port++ {
		p := cprobe{"a", "egress", "tcp", policyPeerIP, port, isListed[port], "namespace PolicyEndpoint/e2e/a"}
		if p.allow {
			p.decider = "admin ClusterPolicyEndpoint/ports"
			if !n.try(p) {
				t.Errorf("%s: listed, but the connection failed", p)
			}
		}
		if v := n.verdict(p); !p.verdictAgrees(v) {
			t.Errorf("%s: the verdict program says %q, want %s by %q", p, v, allowText(p.allow), p.decider)
		}
	}
}

// Every ClusterPolicyEndpoint removed: the pods are as open as their
// NetworkPolicy (a) and the default (b) say again.
func TestPrivilegedClusterAllRemoved(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA, "b": podB})
	n.start(map[string]string{
		"a":     policyEndpoint("a", podA, []string{"Egress"}, nil, []peRule{{cidr: "10.0.1.0/24", ports: []string{"TCP 80"}}}),
		"admin": clusterPolicyEndpoint("deny-peer", "Admin", 10, []string{podA, podB}, []cpeRule{{cidr: "10.0.1.0/24", action: "Deny"}}, []cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}, action: "Deny"}}),
		"baseline": clusterPolicyEndpoint("baseline", "Baseline", 10, []string{podA, podB}, nil,
			[]cpeRule{{cidr: "10.0.1.0/24", action: "Deny"}}),
	})
	n.expect(t,
		cprobe{"a", "egress", "tcp", policyPeerIP, 80, false, "admin ClusterPolicyEndpoint/deny-peer"},
		cprobe{"a", "egress", "tcp", peerC2, 80, true, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "ingress", "tcp", policyPeerIP, 80, false, "admin ClusterPolicyEndpoint/deny-peer"},
		cprobe{"b", "egress", "tcp", policyPeerIP, 80, false, "admin ClusterPolicyEndpoint/deny-peer"},
		cprobe{"b", "egress", "udp", peerC2, 53, false, "baseline ClusterPolicyEndpoint/baseline"},
		cprobe{"b", "ingress", "udp", peerC2, 53, false, "admin ClusterPolicyEndpoint/deny-peer"},
	)
	n.remove("admin")
	n.remove("baseline")
	n.expect(t,
		cprobe{"a", "egress", "tcp", policyPeerIP, 80, true, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "tcp", peerC2, 80, true, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 81, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "ingress", "tcp", policyPeerIP, 80, true, "default"},
		cprobe{"b", "egress", "tcp", policyPeerIP, 80, true, "default"},
		cprobe{"b", "egress", "udp", peerC2, 53, true, "default"},
		cprobe{"b", "ingress", "udp", peerC2, 53, true, "default"},
	)
	n.agent.WaitFor("cluster-policy-map-entries empty", func() bool {
		return len(n.agent.Rows("cluster-policy-map-entries")) == 0
	})
}

// A restart with ClusterPolicyEndpoints leaves no gap: through a stop
// (SIGTERM) and a start of the agent, and then a kill -9 and a start, two
// probe loops run: a flow the Admin tier denies (the peer to pod a, TCP
// 80) never passes, and a flow it accepts over the pod's isolation (a to
// the peer, TCP 443, each a new connection) never fails.
func TestPrivilegedClusterRestartNoGap(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA})
	n.start(map[string]string{
		"a": policyEndpoint("a", podA, []string{"Egress"}, nil, nil),
		"cpe": clusterPolicyEndpoint("keep", "Admin", 10, []string{podA},
			[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}, action: "Deny"}},
			[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 443"}, action: "Accept"}}),
	})
	denied := cprobe{"a", "ingress", "tcp", policyPeerIP, 80, false, "admin ClusterPolicyEndpoint/keep"}
	allowed := cprobe{"a", "egress", "tcp", policyPeerIP, 443, true, "admin ClusterPolicyEndpoint/keep"}
	n.expect(t, denied, allowed)
	if t.Failed() {
		t.FailNow()
	}
	ns := n.agent.NetNS()
	for _, how := range []string{"SIGTERM", "kill -9"} {
		var wg sync.WaitGroup
		var stop atomic.Bool
		var leaked, failed, tries atomic.Int64
		// Four loops on the denied flow (each try of it waits out its
		// timeout), two on the allowed one.
		for _, p := range []cprobe{denied, denied, denied, denied, allowed, allowed} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					tries.Add(1)
					if got := n.try(p); got && !p.allow {
						leaked.Add(1)
					} else if !got && p.allow {
						failed.Add(1)
					}
				}
			}()
		}
		time.Sleep(300 * time.Millisecond)
		if how == "SIGTERM" {
			if _, err := n.agent.Stop(); err != nil {
				t.Fatal(err)
			}
		} else {
			n.agent.Kill9()
		}
		time.Sleep(500 * time.Millisecond) // some tries with no agent at all
		n.agent.StartInNetNS(ns)
		n.agent.WaitHealthy()
		waitAttached(n.agent, 1)
		n.agent.WaitFor("cluster-policy-map-entries Done", func() bool {
			rows := n.agent.Rows("cluster-policy-map-entries")
			return len(rows) > 0 && !strings.Contains(fmt.Sprint(rows), "Pending")
		})
		time.Sleep(300 * time.Millisecond)
		stop.Store(true)
		wg.Wait()
		t.Logf("%s: %d probes through the restart", how, tries.Load())
		if k := leaked.Load(); k > 0 {
			t.Errorf("%s: %d connections the Admin tier denies passed through the restart", how, k)
		}
		if k := failed.Load(); k > 0 {
			t.Errorf("%s: %d connections the Admin tier accepts failed through the restart", how, k)
		}
		n.expect(t, denied, allowed)
	}
}

// The replies of a connection allowed at any step pass, whatever the
// other direction says: pod a's egress is accepted by the Admin tier while
// a Baseline Deny denies all its ingress; b's egress is allowed by its
// NetworkPolicy, and c's by the Baseline tier, while an Admin Deny denies
// their ingress; d's egress reaches the default (a Pass) while an Admin
// Deny denies its ingress. Every connection works (TCP and UDP), and a
// connection opened from the peer does not.
func TestPrivilegedClusterRepliesOfAllowedConnections(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA, "b": podB, "c": podC, "d": podD})
	n.start(map[string]string{
		"b": policyEndpoint("b", podB, []string{"Egress"}, nil, []peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 81", "UDP 53"}}}),
		"admin": clusterPolicyEndpoint("accept-a", "Admin", 10, []string{podA}, nil,
			[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80", "UDP 53"}, action: "Accept"}}) + "---\n" +
			clusterPolicyEndpoint("deny-in", "Admin", 20, []string{podB, podC, podD},
				[]cpeRule{{cidr: "10.0.1.0/24", action: "Deny"}},
				[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 83", "UDP 53"}, action: "Pass"}}),
		"baseline": clusterPolicyEndpoint("baseline", "Baseline", 10, []string{podA, podC}, []cpeRule{{cidr: "0.0.0.0/0", action: "Deny"}},
			[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 82", "UDP 53"}, action: "Accept"}}),
	})
	n.expect(t,
		cprobe{"a", "egress", "tcp", policyPeerIP, 80, true, "admin ClusterPolicyEndpoint/accept-a"},
		cprobe{"a", "egress", "udp", policyPeerIP, 53, true, "admin ClusterPolicyEndpoint/accept-a"},
		cprobe{"a", "ingress", "tcp", policyPeerIP, 80, false, "baseline ClusterPolicyEndpoint/baseline"},
		cprobe{"a", "ingress", "udp", policyPeerIP, 53, false, "baseline ClusterPolicyEndpoint/baseline"},
		cprobe{"b", "egress", "tcp", policyPeerIP, 81, true, "namespace PolicyEndpoint/e2e/b"},
		cprobe{"b", "egress", "udp", policyPeerIP, 53, true, "namespace PolicyEndpoint/e2e/b"},
		cprobe{"b", "ingress", "tcp", policyPeerIP, 81, false, "admin ClusterPolicyEndpoint/deny-in"},
		cprobe{"c", "egress", "tcp", policyPeerIP, 82, true, "baseline ClusterPolicyEndpoint/baseline"},
		cprobe{"c", "egress", "udp", policyPeerIP, 53, true, "baseline ClusterPolicyEndpoint/baseline"},
		cprobe{"c", "ingress", "tcp", policyPeerIP, 82, false, "admin ClusterPolicyEndpoint/deny-in"},
		cprobe{"d", "egress", "tcp", policyPeerIP, 83, true, "default"},
		cprobe{"d", "egress", "udp", policyPeerIP, 53, true, "default"},
		cprobe{"d", "ingress", "tcp", policyPeerIP, 83, false, "admin ClusterPolicyEndpoint/deny-in"},
	)
	// The replies are the way back of each connection: the verdict program
	// denies that way for a new packet (above), the traffic passed.
	for _, p := range []cprobe{
		{"a", "ingress", "tcp", policyPeerIP, 40000, false, "baseline ClusterPolicyEndpoint/baseline"},
		{"b", "ingress", "tcp", policyPeerIP, 40000, false, "admin ClusterPolicyEndpoint/deny-in"},
		{"c", "ingress", "tcp", policyPeerIP, 40000, false, "admin ClusterPolicyEndpoint/deny-in"},
		{"d", "ingress", "tcp", policyPeerIP, 40000, false, "admin ClusterPolicyEndpoint/deny-in"},
	} {
		if v := n.verdict(p); !p.verdictAgrees(v) {
			t.Errorf("%s (a reply's way, as a new packet): the verdict program says %q, want DENY by %q", p, v, p.decider)
		}
	}
}

// Fail closed: a bad field in a new ClusterPolicyEndpoint isolates the
// pods it names (only the node IP gets through, both ways), and a bad
// field in an existing one keeps its last good version (traffic as before
// the bad write). Health is Degraded naming the file, the field and the
// value; the good files make it healthy again, and the pods as their
// objects say.
func TestPrivilegedClusterFailsClosed(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA, "b": podB})
	good := clusterPolicyEndpoint("guard-a", "Admin", 10, []string{podA},
		[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}, action: "Deny"}}, nil)
	n.start(map[string]string{"guard": good})
	before := []cprobe{
		{"a", "ingress", "tcp", policyPeerIP, 80, false, "admin ClusterPolicyEndpoint/guard-a"},
		{"a", "ingress", "tcp", policyPeerIP, 81, true, "default"},
		{"a", "egress", "tcp", policyPeerIP, 80, true, "default"},
	}
	n.expect(t, append(before,
		cprobe{"b", "egress", "tcp", policyPeerIP, 80, true, "default"},
		cprobe{"b", "ingress", "tcp", policyPeerIP, 80, true, "default"})...)

	healthSays := func(what string) {
		t.Helper()
		n.agent.WaitFor("health Degraded: "+what, func() bool {
			code, body, err := n.agent.Get("/healthz")
			return err == nil && code != 200 && strings.Contains(string(body), what)
		})
	}

	// A new object with a value that cannot be read, naming pod b.
	bad := strings.Replace(clusterPolicyEndpoint("open-b", "Baseline", 900, []string{podB}, nil,
		[]cpeRule{{cidr: "0.0.0.0/0", action: "Accept"}}), `cidr: "0.0.0.0/0"`, `cidr: "0.0.0.0/33"`, 1)
	n.write("new", bad)
	healthSays(`new.yaml: open-b: field spec.egress[0].cidr: value \"0.0.0.0/33\" is not a CIDR`)
	n.expect(t, append(before,
		cprobe{"b", "egress", "tcp", policyPeerIP, 80, false, "admin ClusterPolicyEndpoint/open-b"},
		cprobe{"b", "egress", "udp", peerC2, 53, false, "admin ClusterPolicyEndpoint/open-b"},
		cprobe{"b", "ingress", "tcp", policyPeerIP, 80, false, "admin ClusterPolicyEndpoint/open-b"},
		cprobe{"b", "ingress", "udp", policyPeerIP, 53, false, "admin ClusterPolicyEndpoint/open-b"},
		cprobe{"b", "ingress", "tcp", policyNodeIP, 80, true, "admin node IP"},
		cprobe{"b", "egress", "tcp", policyNodeIP, 80, true, "admin node IP"},
		cprobe{"b", "egress", "udp", policyNodeIP, 53, true, "admin node IP"})...)
	if show := n.agent.MustDbg("shell", "--", "db/show", "cluster-policy-endpoints"); !strings.Contains(show, "not valid and no last good version") {
		t.Errorf("open-b's row does not say it is a stand-in:\n%s", show)
	}

	// The existing object gets a bad value: its last good version stays.
	n.write("guard", strings.Replace(good, "action: Deny", "action: Drop", 1))
	healthSays(`guard.yaml: guard-a: field spec.ingress[0].action: value \"Drop\" is not Accept, Deny or Pass`)
	n.expect(t, before...)
	n.write("guard", strings.Replace(good, "port: 80", "port: 0", 1))
	healthSays(`guard.yaml: guard-a: field spec.ingress[0].ports[0].port: value 0 is outside 1..65535`)
	n.expect(t, before...)
	if show := n.agent.MustDbg("shell", "--", "db/show", "cluster-policy-endpoints"); !strings.Contains(show, "its last good version stays in force") {
		t.Errorf("guard-a's row does not say its last good version is kept:\n%s", show)
	}

	// Valid again: healthy, and b as its object says (a Baseline Accept).
	n.write("guard", good)
	n.write("new", strings.Replace(bad, `cidr: "0.0.0.0/33"`, `cidr: "0.0.0.0/0"`, 1))
	n.agent.WaitHealthy()
	n.expect(t, append(before,
		cprobe{"b", "egress", "tcp", policyPeerIP, 80, true, "baseline ClusterPolicyEndpoint/open-b"},
		cprobe{"b", "ingress", "tcp", policyPeerIP, 80, true, "default"})...)
}

// Two peers whose Admin values agree on their first eight intervals (as
// many as a row's text shows) keep their own values: every peer is denied
// eight TCP ports, 10.0.1.2 is accepted UDP 53 and 10.0.1.3 denied it, for
// a pod whose PolicyEndpoint isolates its ingress. UDP 53 from 10.0.1.3
// must not pass (it did before 676a388: the compiler interned cluster
// values by their text, which is cut after eight intervals, and 10.0.1.3
// got 10.0.1.2's value).
func TestPrivilegedClusterDenyNotTakenFromAnotherPeer(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA})
	var eight []string
	for port := 1; port <= 15; port += 2 {
		eight = append(eight, fmt.Sprintf("TCP %d", port))
	}
	n.start(map[string]string{
		"a": policyEndpoint("a", podA, []string{"Ingress"}, nil, nil),
		"cpe": clusterPolicyEndpoint("peers", "Admin", 2, []string{podA}, []cpeRule{
			{cidr: "0.0.0.0/0", ports: eight, action: "Deny"},
			{cidr: policyPeerIP + "/32", ports: []string{"UDP 53"}, action: "Accept"},
			{cidr: peerC2 + "/32", ports: []string{"UDP 53"}, action: "Deny"},
		}, nil),
	})
	n.expect(t,
		cprobe{"a", "ingress", "udp", policyPeerIP, 53, true, "admin ClusterPolicyEndpoint/peers"},
		cprobe{"a", "ingress", "udp", peerC2, 53, false, "admin ClusterPolicyEndpoint/peers"},
		cprobe{"a", "ingress", "udp", peerC3, 53, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "ingress", "tcp", peerC2, 80, false, "namespace PolicyEndpoint/e2e/a"},
	)
}

// On pods that enimasq-cni itself wired (its veths, routes and rules, from
// the ENI IPAM of the sample CiliumNode), an Admin ClusterPolicyEndpoint
// denies the client the server's TCP 81 while TCP 80 stays open (no
// NetworkPolicy selects them: the default allows), and a Baseline one
// denies the server's egress to the client's TCP 80 (a new connection)
// but not the replies of the client's connections.
func TestPrivilegedClusterOnEnimasqCNIPods(t *testing.T) {
	topo := newVPCTopology(t)
	a, dir := cniPolicyAgent(t, topo)
	cni := newCNIRuntime(t, topo, a.APISocket())
	nsA, nsB := cni.newPod("client"), cni.newPod("server")
	ipA, ipB := cni.add(nsA, "client"), cni.add(nsB, "server")
	hA, hB := nsHandle(t, nsA), nsHandle(t, nsB)
	for _, c := range []struct {
		ns netns.NsHandle
		ip string
	}{{hA, ipA}, {hB, ipB}} {
		for _, port := range []int{80, 81} {
			if err := celltest.InNS(c.ns, func() error { return answerOK(t, "tcp4", net.JoinHostPort(c.ip, strconv.Itoa(port))) }); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !connectTCP(hA, ipB, 80) || !connectTCP(hA, ipB, 81) || !connectTCP(hB, ipA, 80) {
		t.Fatal("the CNI's pods do not reach each other without a policy")
	}
	WriteFileAtomic(t, filepath.Join(dir, "cpes.yaml"), onCNINode(
		clusterPolicyEndpoint("guard-server", "Admin", 10, []string{ipB},
			[]cpeRule{{cidr: ipA + "/32", ports: []string{"TCP 81"}, action: "Deny"}}, nil)+"---\n"+
			clusterPolicyEndpoint("server-out", "Baseline", 10, []string{ipB}, nil,
				[]cpeRule{{cidr: ipA + "/32", action: "Deny"}})))
	waitAttached(a, 2)
	verdict := func(dir, peer string, port int) string {
		out, _, _ := a.Dbg("policy", "verdict", "--pod", ipB, "--direction", dir, "--peer", peer, "--proto", "tcp", "--port", strconv.Itoa(port))
		return strings.TrimSpace(out)
	}
	a.WaitFor("the verdict program denying client -> server tcp/81", func() bool {
		return strings.HasPrefix(verdict("ingress", ipA, 81), "DENY")
	})
	for _, c := range []struct {
		what        string
		ok          bool
		want        bool
		dir         string
		peer        string
		port        int
		verdictWant string
	}{
		{"client -> server tcp/81 (Admin Deny)", connectTCP(hA, ipB, 81), false, "ingress", ipA, 81, "DENY ingress " + ipB + " " + ipA + " tcp/81: admin ClusterPolicyEndpoint/guard-server: "},
		{"client -> server tcp/80 (the default; the replies pass the Baseline Deny of the server's egress)", connectTCP(hA, ipB, 80), true, "ingress", ipA, 80, "ALLOW ingress " + ipB + " " + ipA + " tcp/80: default: "},
		{"server -> client tcp/80 (Baseline Deny)", connectTCP(hB, ipA, 80), false, "egress", ipA, 80, "DENY egress " + ipB + " " + ipA + " tcp/80: baseline ClusterPolicyEndpoint/server-out: "},
	} {
		v := verdict(c.dir, c.peer, c.port)
		if c.ok != c.want || !strings.HasPrefix(v, c.verdictWant) {
			t.Errorf("%s: traffic passed=%t, want %t; the verdict program: %s, want %q...", c.what, c.ok, c.want, v, c.verdictWant)
		}
	}
}
