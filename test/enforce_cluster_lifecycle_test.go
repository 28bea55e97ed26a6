package test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

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
		// Four loops on the denied flow (each try of it waits out its
		// timeout), two on the allowed one.
		stop := n.probeLoops(denied, denied, denied, denied, allowed, allowed)
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
		c := stop()
		t.Logf("%s: %d probes through the restart", how, c.tries)
		if c.leaked > 0 {
			t.Errorf("%s: %d connections the Admin tier denies passed through the restart", how, c.leaked)
		}
		if c.failed > 0 {
			t.Errorf("%s: %d connections the Admin tier accepts failed through the restart", how, c.failed)
		}
		n.expect(t, denied, allowed)
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
