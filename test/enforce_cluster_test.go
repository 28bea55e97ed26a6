package test

// ClusterPolicyEndpoints as traffic: each case of the tiers' order (the AWS
// agent v1.5.0's: Admin, NetworkPolicy, Baseline, default) with real TCP
// and UDP between pods behind veths and a peer, and the verdict program
// (enimasq-dbg policy verdict, the agent's loaded program) agreeing on each
// probe and naming the step and the object that decided. Every test fails
// on an agent that ignores ClusterPolicyEndpoints: each has a probe whose
// outcome only a ClusterPolicyEndpoint gives.

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/enimasq/enimasq/cells/celltest"
)

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
