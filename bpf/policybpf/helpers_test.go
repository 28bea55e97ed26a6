package policybpf

import (
	"log/slog"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/enimasq/enimasq/bpf"
)

// The test helpers of package bpf's tests that these use too.

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func openPinnedForTest(tb testing.TB, spec *ebpf.MapSpec, dir string) *ebpf.Map {
	tb.Helper()
	m, err := bpf.OpenPinned(discardLogger(), spec, dir)
	if err != nil {
		tb.Fatalf("OpenPinned(%s): %v", spec.Name, err)
	}
	tb.Cleanup(func() { m.Close() })
	return m
}

// newProgramMaps makes unpinned policy and cluster maps (both directions
// and families, 64 entries) and the named state maps, as the program
// declares them (a connection-tracking map of 64), closed at cleanup.
func newProgramMaps(t *testing.T, stateNames ...string) map[string]*ebpf.Map {
	t.Helper()
	maps := map[string]*ebpf.Map{}
	newMap := func(spec *ebpf.MapSpec) {
		t.Helper()
		m, err := bpf.NewUnpinnedMap(spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		maps[spec.Name] = m
	}
	for _, d := range []Direction{Egress, Ingress} {
		for _, f := range []bpf.Family{bpf.IPv4, bpf.IPv6} {
			newMap(PolicyMapSpec(d, f, 64))
			newMap(ClusterMapSpec(d, f, 64))
		}
	}
	for _, name := range stateNames {
		spec, err := PolicyStateSpec(name)
		if err != nil {
			t.Fatal(err)
		}
		if name == PolicyCTMapName {
			spec.MaxEntries = 64
		}
		newMap(spec)
	}
	return maps
}

// putPolicy writes the value of pod's key for peer (version 0) in a
// policy or cluster map of maps.
func putPolicy(t *testing.T, maps map[string]*ebpf.Map, mapName, pod, peer string, v *PolicyValue) {
	t.Helper()
	key, err := bpf.EncodePolicyKey(netip.MustParseAddr(pod), netip.MustParsePrefix(peer))
	if err != nil {
		t.Fatal(err)
	}
	b, spill, err := v.Encode()
	if err != nil || len(spill) > 0 {
		t.Fatalf("encode %s: %v (%d chunks)", v, err, len(spill))
	}
	if err := maps[mapName].Put(key, b); err != nil {
		t.Fatalf("put %s %s %s: %v", mapName, pod, peer, err)
	}
}
