package test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A restart with another --policy-map-max-entries (what the docs advise
// on a full map) leaves no gap: the policy and cluster maps, their chunk
// maps, are resized with their entries (copied before the pins move), so
// the programs an earlier run left on the devices and the ones this run
// loads meet maps that hold every pod's policy. Through a resize up and a
// resize down, probe loops run: flows the NetworkPolicy (deny-all ingress)
// and the Admin tier deny never pass, a flow the Admin tier accepts over
// the pod's egress isolation never fails; the agent writes no new version
// of a pod whose inputs did not change (the resized maps are adopted).
func TestPrivilegedPolicyResizeNoGap(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA})
	n.start(map[string]string{
		"a": policyEndpoint("a", podA, []string{"Ingress", "Egress"}, nil, nil),
		"cpe": clusterPolicyEndpoint("keep", "Admin", 10, []string{podA},
			[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}, action: "Deny"}},
			[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 443"}, action: "Accept"}}),
	})
	deniedAdmin := cprobe{"a", "ingress", "tcp", policyPeerIP, 80, false, "admin ClusterPolicyEndpoint/keep"}
	deniedNP := cprobe{"a", "ingress", "tcp", policyPeerIP, 8080, false, "namespace PolicyEndpoint/e2e/a"}
	allowed := cprobe{"a", "egress", "tcp", policyPeerIP, 443, true, "admin ClusterPolicyEndpoint/keep"}
	n.expect(t, deniedAdmin, deniedNP, allowed)
	if t.Failed() {
		t.FailNow()
	}
	versions := func() string {
		var out []string
		for _, r := range n.agent.Rows("policy-versions") {
			out = append(out, fmt.Sprint(r["Pod"], r["NetworkPolicy"], r["Cluster"]))
		}
		return strings.Join(out, "; ")
	}
	before := versions()
	ns := n.agent.NetNS()
	for _, size := range []int{70000, 40000} {
		stop := n.probeLoops(deniedAdmin, deniedAdmin, deniedNP, deniedNP, allowed, allowed)
		time.Sleep(300 * time.Millisecond)
		if _, err := n.agent.Stop(); err != nil {
			t.Fatal(err)
		}
		n.agent.Args = append(n.agent.Args, fmt.Sprintf("--policy-map-max-entries=%d", size))
		n.agent.StartInNetNS(ns)
		n.agent.WaitHealthy()
		waitAttached(n.agent, 1)
		for _, table := range []string{"policy-map-entries", "cluster-policy-map-entries"} {
			n.agent.WaitFor(table+" Done", func() bool {
				rows := n.agent.Rows(table)
				return len(rows) > 0 && !strings.Contains(fmt.Sprint(rows), "Pending")
			})
		}
		time.Sleep(300 * time.Millisecond)
		c := stop()
		t.Logf("resize to %d: %d probes through the restart", size, c.tries)
		if c.leaked > 0 {
			t.Errorf("resize to %d: %d connections the policy denies passed", size, c.leaked)
		}
		if c.failed > 0 {
			t.Errorf("resize to %d: %d connections the Admin tier accepts failed", size, c.failed)
		}
		if !strings.Contains(n.agent.Log(), "Resized pinned BPF map") {
			t.Errorf("resize to %d: the agent does not log the resize", size)
		}
		st := n.agent.MustDbg("status")
		if !strings.Contains(st, fmt.Sprintf("/%d", size)) {
			t.Errorf("resize to %d: status does not show the new capacity:\n%s", size, st)
		}
		if got := versions(); got != before {
			t.Errorf("resize to %d: versions %s, want %s (adopted, unchanged)", size, got, before)
		}
		n.expect(t, deniedAdmin, deniedNP, allowed)
	}
}
