package bpf

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/sys/unix"
)

var (
	_ reconciler.Operations[*testEntry]      = (*Ops[*testEntry])(nil)
	_ reconciler.BatchOperations[*testEntry] = (*Ops[*testEntry])(nil)
)

// badPrefixLenKey is a v4 key whose prefix length (33) the kernel refuses.
func badPrefixLenKey() []byte { return kernelKey(33, 10, 9, 9, 9) }

func batchOf(entries ...*testEntry) []reconciler.BatchEntry[*testEntry] {
	b := make([]reconciler.BatchEntry[*testEntry], len(entries))
	for i, e := range entries {
		b[i].Object = e
	}
	return b
}

func v4Entries(tb testing.TB, prefixes ...string) []*testEntry {
	out := make([]*testEntry, len(prefixes))
	for i, p := range prefixes {
		out[i] = newPrefixEntry(tb, netip.MustParsePrefix(p))
	}
	return out
}

func newFakeOps() (*Ops[*testEntry], *FakeMap, *FakeMap) {
	v4 := NewFakeMap(KeySizeV4, 1, 8)
	v6 := NewFakeMap(KeySizeV6, 1, 8)
	ops := NewOps[*testEntry](nil)
	ops.SetMap(IPMasqV4MapName, v4)
	ops.SetMap(IPMasqV6MapName, v6)
	return ops, v4, v6
}

func TestUpdateBatchEveryEntryGetsItsOwnResult(t *testing.T) {
	ops, v4, v6 := newFakeOps()
	es := v4Entries(t, "10.0.0.0/8", "172.16.0.0/12", "fe80::/10", "192.168.0.0/16", "100::/64")
	bad := newTestEntry(IPMasqV4MapName, badPrefixLenKey(), IPMasqValue())
	short := newTestEntry(IPMasqV4MapName, []byte{1, 2, 3}, IPMasqValue())
	skipped := newTestEntry("", nil, nil)
	closed := newTestEntry("cilium_other", kernelKey(8, 10, 0, 0, 0), IPMasqValue())
	batch := batchOf(es[0], bad, es[1], es[2], short, skipped, es[3], closed, es[4])

	ops.UpdateBatch(context.Background(), nil, batch)

	wantErr := map[*testEntry]string{
		bad:    "update cilium_ipmasq_v4 key 210000000a090909: batch update",
		short:  "3 bytes, map takes 8",
		closed: "map cilium_other not open",
	}
	for _, be := range batch {
		want, fails := wantErr[be.Object]
		switch {
		case fails && (be.Result == nil || !strings.Contains(be.Result.Error(), want)):
			t.Errorf("%v: result %v, want error containing %q", be.Object.TableRow(), be.Result, want)
		case !fails && be.Result != nil:
			t.Errorf("%v: unexpected error %v", be.Object.TableRow(), be.Result)
		}
	}
	if !errors.Is(batch[1].Result, unix.EINVAL) {
		t.Errorf("bad key result %v does not wrap EINVAL", batch[1].Result)
	}
	if v4.len() != 3 || v6.len() != 2 {
		t.Errorf("maps hold %d v4 and %d v6 entries, want 3 and 2", v4.len(), v6.len())
	}
}

// TestUpdateBatchFullMap: in a map of 3 entries, a batch of 5 applies the
// first 3 and fails the other 2 with ENOSPC, each on its own; on the fake
// and (as root) on a kernel map.
func TestUpdateBatchFullMap(t *testing.T) {
	for name, newMap := range map[string]func(t *testing.T) Map{
		"fake":   func(*testing.T) Map { return NewFakeMap(KeySizeV4, 1, 3) },
		"kernel": func(t *testing.T) Map { return openTestMap(t, LPMSpec("full_map", KeySizeV4, 1, 3)) },
	} {
		t.Run(name, func(t *testing.T) {
			m := newMap(t)
			ops := NewOps[*testEntry](nil)
			ops.SetMap("full_map", m)
			var es []*testEntry
			for _, p := range v4Prefixes(0, 5) {
				key, _ := EncodePrefix(p)
				es = append(es, newTestEntry("full_map", key, IPMasqValue()))
			}
			batch := batchOf(es...)
			ops.UpdateBatch(context.Background(), nil, batch)
			for i, be := range batch {
				if i < 3 && be.Result != nil {
					t.Errorf("entry %d: %v", i, be.Result)
				}
				if i >= 3 && !errors.Is(be.Result, unix.ENOSPC) {
					t.Errorf("entry %d: %v, want ENOSPC", i, be.Result)
				}
			}
			if keys, err := Keys(m); err != nil || len(keys) != 3 {
				t.Errorf("map holds %d keys (%v), want 3", len(keys), err)
			}
		})
	}
}

func TestDeleteBatchMissingKeyIsSuccess(t *testing.T) {
	ops, v4, _ := newFakeOps()
	es := v4Entries(t, "10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32", "10.0.0.4/32")
	for _, e := range []*testEntry{es[0], es[2], es[3]} {
		if err := ops.Update(context.Background(), nil, 0, e); err != nil {
			t.Fatal(err)
		}
	}
	bad := newTestEntry(IPMasqV4MapName, badPrefixLenKey(), IPMasqValue())
	batch := batchOf(es[0], es[1], bad, es[2], es[3])
	ops.DeleteBatch(context.Background(), nil, batch)
	for i, be := range batch {
		if be.Object == bad {
			if !errors.Is(be.Result, unix.EINVAL) {
				t.Errorf("bad key: %v, want EINVAL", be.Result)
			}
		} else if be.Result != nil {
			t.Errorf("entry %d: %v", i, be.Result)
		}
	}
	if v4.len() != 0 {
		t.Errorf("%d entries left", v4.len())
	}
}

func TestSingleOps(t *testing.T) {
	ops, v4, _ := newFakeOps()
	ctx := context.Background()
	e := v4Entries(t, "10.0.0.0/8")[0]
	if err := ops.Update(ctx, nil, 0, e); err != nil {
		t.Fatal(err)
	}
	if v, ok := v4.lookup(e.MapKey()); !ok || v[0] != 1 {
		t.Fatalf("lookup: %v %v", v, ok)
	}
	if err := ops.Delete(ctx, nil, 0, e); err != nil {
		t.Fatal(err)
	}
	if err := ops.Delete(ctx, nil, 0, e); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	if err := ops.Update(ctx, nil, 0, newTestEntry("", nil, nil)); err != nil {
		t.Fatalf("entry with no map: %v", err)
	}
	err := ops.Update(ctx, nil, 0, newTestEntry("nope", e.MapKey(), e.MapValue()))
	if err == nil || !strings.Contains(err.Error(), "map nope not open") {
		t.Fatalf("unknown map: %v", err)
	}
	bad := newTestEntry(IPMasqV4MapName, badPrefixLenKey(), IPMasqValue())
	err = ops.Update(ctx, nil, 0, bad)
	if !errors.Is(err, unix.EINVAL) || !strings.Contains(err.Error(), "update cilium_ipmasq_v4 key") {
		t.Fatalf("bad key: %v", err)
	}
	err = ops.Update(ctx, nil, 0, newTestEntry(IPMasqV4MapName, e.MapKey(), []byte{1, 2}))
	if err == nil || !strings.Contains(err.Error(), "value of 2 bytes, map takes 1") {
		t.Fatalf("wrong value size: %v", err)
	}
}

func TestBatchCancelledContext(t *testing.T) {
	ops, v4, _ := newFakeOps()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	batch := batchOf(v4Entries(t, "10.0.0.1/32", "10.0.0.2/32")...)
	ops.UpdateBatch(ctx, nil, batch)
	for _, be := range batch {
		if !errors.Is(be.Result, context.Canceled) {
			t.Errorf("result %v, want context.Canceled", be.Result)
		}
	}
	if v4.len() != 0 {
		t.Errorf("%d entries written after cancel", v4.len())
	}
}

// notSupportedMap refuses batch operations like an old kernel.
type notSupportedMap struct{ *FakeMap }

func (notSupportedMap) BatchUpdate(any, any, *ebpf.BatchOptions) (int, error) {
	return 0, ebpf.ErrNotSupported
}
func (notSupportedMap) BatchDelete(any, *ebpf.BatchOptions) (int, error) {
	return 0, ebpf.ErrNotSupported
}
func (notSupportedMap) BatchLookup(*ebpf.MapBatchCursor, any, any, *ebpf.BatchOptions) (int, error) {
	return 0, ebpf.ErrNotSupported
}

func TestFallbackWithoutBatchAPI(t *testing.T) {
	m := notSupportedMap{NewFakeMap(KeySizeV4, 1, 8)}
	ops := NewOps[*testEntry](nil)
	ops.SetMap(IPMasqV4MapName, m)
	bad := newTestEntry(IPMasqV4MapName, badPrefixLenKey(), IPMasqValue())
	es := v4Entries(t, "10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32")
	batch := batchOf(es[0], bad, es[1], es[2])
	ops.UpdateBatch(context.Background(), nil, batch)
	if batch[0].Result != nil || batch[2].Result != nil || batch[3].Result != nil || !errors.Is(batch[1].Result, unix.EINVAL) {
		t.Fatalf("results %v %v %v %v", batch[0].Result, batch[1].Result, batch[2].Result, batch[3].Result)
	}
	// Prune walks keys one by one and deletes one by one.
	if err := ops.Prune(context.Background(), nil, entrySeq(es[1])); err != nil {
		t.Fatal(err)
	}
	if m.len() != 1 {
		t.Fatalf("%d entries after prune, want 1", m.len())
	}
	if _, ok := m.lookup(es[1].MapKey()); !ok {
		t.Fatal("desired key pruned")
	}
}

func entrySeq(entries ...*testEntry) func(func(*testEntry, statedb.Revision) bool) {
	return func(yield func(*testEntry, statedb.Revision) bool) {
		for i, e := range entries {
			if !yield(e, statedb.Revision(i+1)) {
				return
			}
		}
	}
}

func TestPruneDeletesOnlyUndesired(t *testing.T) {
	ops, v4, v6 := newFakeOps()
	ctx := context.Background()
	all := v4Entries(t, "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fe80::/10", "100::/64")
	for _, e := range all {
		if err := ops.Update(ctx, nil, 0, e); err != nil {
			t.Fatal(err)
		}
	}
	// A key written by someone else with host bits set: it is the same trie
	// node as the desired 10.0.0.0/8 and must stay.
	if err := v4.Put(kernelKey(8, 10, 1, 2, 3), []byte{1}); err != nil {
		t.Fatal(err)
	}
	desired := []*testEntry{all[0], all[3], newTestEntry("", nil, nil), newTestEntry("cilium_other", all[1].MapKey(), all[1].MapValue())}
	if err := ops.Prune(ctx, nil, entrySeq(desired...)); err != nil {
		t.Fatal(err)
	}
	got := slices.Sorted(func(yield func(string) bool) {
		for p := range mapPrefixes(t, v4) {
			yield(p.String())
		}
		for p := range mapPrefixes(t, v6) {
			yield(p.String())
		}
	})
	want := []string{"10.0.0.0/8", "fe80::/10"}
	if !slices.Equal(got, want) {
		t.Fatalf("after prune: %v, want %v", got, want)
	}
}

func TestGroupByMap(t *testing.T) {
	mk := func(name string) *testEntry { return newTestEntry(name, nil, nil) }
	batch := batchOf(mk("a"), mk("b"), mk(""), mk("a"), mk("c"), mk("b"), mk("a"))
	groups := groupByMap(batch)
	want := []mapGroup{{"a", []int{0, 3, 6}}, {"b", []int{1, 5}}, {"c", []int{4}}}
	if len(groups) != len(want) {
		t.Fatalf("groups %v, want %v", groups, want)
	}
	for i := range want {
		if groups[i].name != want[i].name || !slices.Equal(groups[i].idx, want[i].idx) {
			t.Errorf("group %d: %v, want %v", i, groups[i], want[i])
		}
	}
}

func TestApplyBatchResumesAfterEachFailure(t *testing.T) {
	failAt := map[int]bool{0: true, 3: true, 4: true, 9: true}
	var applied, failed []int
	applyBatch(context.Background(), 10,
		func(from int) (int, error) {
			for j := from; j < 10; j++ {
				if failAt[j] {
					return j - from, errors.New("no")
				}
				applied = append(applied, j)
			}
			return 10 - from, nil
		},
		func(j int, err error) { failed = append(failed, j) })
	if !slices.Equal(applied, []int{1, 2, 5, 6, 7, 8}) || !slices.Equal(failed, []int{0, 3, 4, 9}) {
		t.Fatalf("applied %v failed %v", applied, failed)
	}
}

func TestSetMapConcurrentWithOps(t *testing.T) {
	ops := NewOps[*testEntry](map[string]*ebpf.Map{IPMasqV4MapName: nil})
	e := v4Entries(t, "10.0.0.0/8")[0]
	if err := ops.Update(context.Background(), nil, 0, e); err == nil {
		t.Fatal("nil map was registered")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			ops.SetMap(IPMasqV4MapName, NewFakeMap(KeySizeV4, 1, 8))
		}
	}()
	for range 100 {
		_ = ops.Update(context.Background(), nil, 0, e)
	}
	<-done
	ops.SetMap(IPMasqV4MapName, nil)
	if err := ops.Update(context.Background(), nil, 0, e); err == nil {
		t.Fatal("removed map still used")
	}
}
