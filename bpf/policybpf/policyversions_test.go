package policybpf

import (
	"net/netip"
	"testing"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/celltest"
)

// A pod whose version in force has no key in a map of its tier (the maps
// were replaced under the versions, or the keys deleted behind the agent's
// back) is denied as incomplete in that direction, never judged as a pod
// without policy: the root key of every version the agent brings into force
// is in each map of the tier. Version 0 (no policy of the tier) is not
// looked up as missing.
func TestPrivilegedPolicyVersionNotInTheMapsIsClosed(t *testing.T) {
	celltest.RequireRoot(t)
	maps := newProgramMaps(t)
	vspec, err := PolicyVersionsSpec()
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewUnpinnedMap(vspec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Close() })
	maps[PolicyVersionsMapName] = vm
	pod, peer := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.1.2.3")
	put := func(mapName string, version uint32, prefix string, v *PolicyValue) {
		t.Helper()
		key, err := bpf.AppendPolicyKeyVersion(nil, pod, version, netip.MustParsePrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := v.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if err := maps[mapName].Put(key, b); err != nil {
			t.Fatal(err)
		}
	}
	setVersions := func(np, cluster uint32) {
		t.Helper()
		if err := vm.Put(PolicyPodKey(pod), EncodePolicyVersions(np, cluster)); err != nil {
			t.Fatal(err)
		}
	}
	// Version 3 of the NetworkPolicy tier: egress root denies, 10.1.0.0/16
	// TCP 80; ingress not isolated. Nothing in the cluster maps.
	put(PolicyEgressV4MapName, 3, "0.0.0.0/0", AllowValue())
	put(PolicyEgressV4MapName, 3, "10.1.0.0/16", AllowValue(PortEntry{Protocol: ProtocolTCP, StartPort: 80}))
	put(PolicyIngressV4MapName, 3, "0.0.0.0/0", &PolicyValue{NotIsolated: true})
	prog, err := LoadPolicyProgram(maps)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	run := func(d Direction, port uint16) PolicyResult {
		t.Helper()
		src, dst := pod, peer
		if d == Ingress {
			src, dst = peer, pod
		}
		frame, err := PolicyTestFrame(src, dst, uint8(ProtocolTCP), 40000, port)
		if err != nil {
			t.Fatal(err)
		}
		res, err := prog.Run(d, frame)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	closed := func(step PolicyStep) PolicyResult {
		return PolicyResult{Reason: PolicyIncomplete, Step: step, Interval: -1}
	}

	for _, tc := range []struct {
		name        string
		np, cluster uint32
		dir         Direction
		port        uint16
		want        PolicyResult
	}{
		{"in force", 3, 0, Egress, 80, PolicyResult{Allow: true, Reason: PolicyAllowed, Step: StepNamespace, Interval: 0}},
		{"in force, another port", 3, 0, Egress, 81, PolicyResult{Reason: PolicyDenied, Step: StepNamespace, Interval: -1}},
		{"in force, ingress not isolated", 3, 0, Ingress, 22, PolicyResult{Allow: true, Reason: PolicyNoPolicy, Step: StepDefault, Interval: -1}},
		{"a version the maps do not hold", 4, 0, Egress, 80, closed(StepNamespace)},
		{"a version the maps do not hold, ingress", 4, 0, Ingress, 22, closed(StepNamespace)},
		{"a cluster version the maps do not hold", 3, 4, Egress, 80, closed(StepAdmin)},
		{"no version", 0, 0, Egress, 80, PolicyResult{Allow: true, Reason: PolicyNoPolicy, Step: StepDefault, Interval: -1}},
	} {
		setVersions(tc.np, tc.cluster)
		if got := run(tc.dir, tc.port); got != tc.want {
			t.Errorf("%s (versions %d, %d): %s: %+v, want %+v", tc.name, tc.np, tc.cluster, tc.dir, got, tc.want)
		}
	}
}
