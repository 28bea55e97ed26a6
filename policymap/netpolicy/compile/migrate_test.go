package compile

import (
	"encoding/binary"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
)

// The maps of the release before versions (keys without a version, no
// versions map) are migrated in place: every key at migratedVersion in a
// map of today's layout, the versions map made with each pod at that
// version in the tiers it has keys in and the version recorded as handed
// out; maps of today's layout, or a node that has a versions map, are left
// alone.
func TestPrivilegedMigrateVersionless(t *testing.T) {
	dir := bpf.GlobalsDir(celltest.MountBPFFS(t))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	const maxEntries = 64
	oldKey := func(pod netip.Addr, peer netip.Prefix) []byte {
		k := binary.NativeEndian.AppendUint32(nil, uint32(pod.BitLen()+peer.Bits()))
		k = append(k, pod.AsSlice()...)
		return append(k, peer.Masked().Addr().AsSlice()...)
	}
	value := func(port uint32) []byte {
		b, _, err := policybpf.AllowValue(policybpf.PortEntry{Protocol: policybpf.ProtocolTCP, StartPort: port}).Encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	root, peer := netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("10.1.2.3/32")
	// The release before versions: a in both tiers, b in the NetworkPolicy
	// maps only.
	old := map[string][]bpf.KeyValue{
		policybpf.PolicyEgressV4MapName:  {{Key: oldKey(a, root), Value: value(1)}, {Key: oldKey(a, peer), Value: value(2)}, {Key: oldKey(b, root), Value: value(3)}},
		policybpf.PolicyIngressV4MapName: {{Key: oldKey(a, root), Value: value(4)}, {Key: oldKey(b, root), Value: value(5)}},
		policybpf.ClusterEgressV4MapName: {{Key: oldKey(a, root), Value: value(6)}},
	}
	for name, entries := range old {
		spec := policyKind{}.mapSpec(policybpf.Egress, bpf.IPv4, maxEntries).Copy()
		spec.Name, spec.KeySize = name, spec.KeySize-bpf.PolicyVersionSize
		m, err := bpf.NewUnpinnedMap(spec)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		for _, e := range entries {
			if err := m.Put(e.Key, e.Value); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Pin(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	// The cluster ingress map is of today's layout already: left alone.
	today := clusterKind{}.mapSpec(policybpf.Ingress, bpf.IPv4, maxEntries)
	todays, err := bpf.OpenPinned(slog.New(slog.DiscardHandler), today, dir)
	if err != nil {
		t.Fatal(err)
	}
	todaysKey, _ := bpf.AppendPolicyKeyVersion(nil, a, 7, root)
	if err := todays.Put(todaysKey, value(9)); err != nil {
		t.Fatal(err)
	}
	todays.Close()

	log := slog.New(slog.DiscardHandler)
	if err := migrateVersionless(log, dir, []bpf.Family{bpf.IPv4}, maxEntries); err != nil {
		t.Fatal(err)
	}
	read := func(name string) []bpf.KeyValue {
		t.Helper()
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		defer m.Close()
		got, err := bpf.Entries(bpf.KernelMap{Map: m})
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(got, func(x, y bpf.KeyValue) int { return slices.Compare(x.Key, y.Key) })
		return got
	}
	for name, entries := range old {
		var want []bpf.KeyValue
		for _, e := range entries {
			pod, _ := netip.AddrFromSlice(e.Key[4:8])
			p, _ := netip.AddrFromSlice(e.Key[8:12])
			k, err := bpf.AppendPolicyKeyVersion(nil, pod, migratedVersion, netip.PrefixFrom(p, int(binary.NativeEndian.Uint32(e.Key))-32))
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, bpf.KeyValue{Key: k, Value: e.Value})
		}
		slices.SortFunc(want, func(x, y bpf.KeyValue) int { return slices.Compare(x.Key, y.Key) })
		if got := read(name); !slices.EqualFunc(got, want, func(x, y bpf.KeyValue) bool {
			return string(x.Key) == string(y.Key) && string(x.Value) == string(y.Value)
		}) {
			t.Errorf("%s after the migration: %x, want %x", name, got, want)
		}
	}
	if got := read(today.Name); len(got) != 1 || string(got[0].Key) != string(todaysKey) {
		t.Errorf("%s (today's layout) after the migration: %x, want its one key", today.Name, got)
	}
	wantVersions := map[string][]byte{
		string(policybpf.PolicyPodKey(a)):              policybpf.EncodePolicyVersions(migratedVersion, migratedVersion),
		string(policybpf.PolicyPodKey(b)):              policybpf.EncodePolicyVersions(migratedVersion, 0),
		string(policybpf.PolicyVersionsHighWaterKey()): policybpf.EncodePolicyVersions(migratedVersion, 0),
	}
	got := read(policybpf.PolicyVersionsMapName)
	if len(got) != len(wantVersions) {
		t.Errorf("versions map: %d entries, want %d", len(got), len(wantVersions))
	}
	for _, e := range got {
		if w, ok := wantVersions[string(e.Key)]; !ok || string(w) != string(e.Value) {
			t.Errorf("versions map: %x -> %x, want %x", e.Key, e.Value, w)
		}
	}

	// Migrated maps are not migrated again.
	if err := migrateVersionless(log, dir, []bpf.Family{bpf.IPv4}, maxEntries); err != nil {
		t.Fatal(err)
	}
	if n := len(read(policybpf.PolicyEgressV4MapName)); n != 3 {
		t.Errorf("a second migration changed %s: %d keys", policybpf.PolicyEgressV4MapName, n)
	}

	// A migration that stopped after the versions map: the map of the
	// release before left is migrated, the versions map kept.
	spec := policyKind{}.mapSpec(policybpf.Egress, bpf.IPv4, maxEntries).Copy()
	spec.KeySize -= bpf.PolicyVersionSize
	left, err := bpf.NewUnpinnedMap(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer left.Close()
	if err := left.Put(oldKey(a, root), value(1)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, spec.Name)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := left.Pin(path); err != nil {
		t.Fatal(err)
	}
	if err := migrateVersionless(log, dir, []bpf.Family{bpf.IPv4}, maxEntries); err != nil {
		t.Fatal(err)
	}
	k, _ := bpf.AppendPolicyKeyVersion(nil, a, migratedVersion, root)
	if got := read(spec.Name); len(got) != 1 || string(got[0].Key) != string(k) {
		t.Errorf("%s left by a stopped migration: %x, want %x", spec.Name, got, k)
	}
	if n := len(read(policybpf.PolicyVersionsMapName)); n != len(wantVersions) {
		t.Errorf("versions map after a resumed migration: %d entries, want %d", n, len(wantVersions))
	}
}
