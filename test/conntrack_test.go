package test

import (
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
)

// --policy-conntrack-max sizes the pinned connection-tracking map, and a
// restart with another size starts it afresh at that size.
func TestPrivilegedPolicyConntrackMaxSizesTheTable(t *testing.T) {
	node := newPolicyNode(t)
	node.addPod("a", "enimct0a0a0a", podA)
	a, _ := node.startAgent(map[string]string{"a": policyEndpoint("a", podA, []string{"Ingress"}, nil, nil)}, "--policy-conntrack-max=1024")
	waitAttached(a, 1)
	size := func() uint32 {
		t.Helper()
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpf.GlobalsDir(a.BPFRoot), policybpf.PolicyCTMapName), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		return m.MaxEntries()
	}
	if n := size(); n != 1024 {
		t.Fatalf("%s has %d entries, want --policy-conntrack-max's 1024", policybpf.PolicyCTMapName, n)
	}
	if node.connect(node.peerNS(), podA, 80) {
		t.Error("the peer reached the pod: its ingress is isolated")
	}
	if !node.connect(node.podNS("a"), policyPeerIP, 80) {
		t.Error("the pod did not reach the peer (the reply is tracked)")
	}

	ns := a.NetNS()
	a.Kill9()
	a.Args = append(a.Args, "--policy-conntrack-max=2048") // the last one counts
	a.StartInNetNS(ns)
	a.WaitHealthy()
	waitAttached(a, 1)
	if n := size(); n != 2048 {
		t.Fatalf("after a restart with --policy-conntrack-max=2048: %d entries", n)
	}
	if node.connect(node.peerNS(), podA, 80) {
		t.Error("after the restart the peer reached the pod")
	}
	if !node.connect(node.podNS("a"), policyPeerIP, 80) {
		t.Error("after the restart the pod did not reach the peer")
	}
}
