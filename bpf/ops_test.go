package bpf_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/bpffake"
)

var (
	_ reconciler.Operations[*bpf.TestEntry]      = (*bpf.Ops[*bpf.TestEntry])(nil)
	_ reconciler.BatchOperations[*bpf.TestEntry] = (*bpf.Ops[*bpf.TestEntry])(nil)
)

func newFakeOps() (*bpf.Ops[*bpf.TestEntry], *bpffake.FakeMap, *bpffake.FakeMap) {
	v4 := bpffake.NewFakeMap(bpf.KeySizeV4, 1, 8)
	v6 := bpffake.NewFakeMap(bpf.KeySizeV6, 1, 8)
	ops := bpf.NewOps[*bpf.TestEntry](nil)
	ops.SetMap(bpf.IPMasqV4MapName, v4)
	ops.SetMap(bpf.IPMasqV6MapName, v6)
	return ops, v4, v6
}

func TestUpdateBatchEveryEntryGetsItsOwnResult(t *testing.T) {
	ops, v4, v6 := newFakeOps()
	es := bpf.V4Entries(t, "10.0.0.0/8", "172.16.0.0/12", "fe80::/10", "192.168.0.0/16", "100::/64")
	bad := bpf.NewTestEntry(bpf.IPMasqV4MapName, bpf.BadPrefixLenKey(), bpf.IPMasqValue())
	short := bpf.NewTestEntry(bpf.IPMasqV4MapName, []byte{1, 2, 3}, bpf.IPMasqValue())
	skipped := bpf.NewTestEntry("", nil, nil)
	closed := bpf.NewTestEntry("cilium_other", bpf.KernelKey(8, 10, 0, 0, 0), bpf.IPMasqValue())
	batch := bpf.BatchOf(es[0], bad, es[1], es[2], short, skipped, es[3], closed, es[4])

	ops.UpdateBatch(context.Background(), nil, batch)

	wantErr := map[*bpf.TestEntry]string{
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
	if v4.Len() != 3 || v6.Len() != 2 {
		t.Errorf("maps hold %d v4 and %d v6 entries, want 3 and 2", v4.Len(), v6.Len())
	}
}

// TestUpdateBatchFullMap: in a map of 3 entries, a batch of 5 applies the
// first 3 and fails the other 2 with ENOSPC, each on its own; on the fake
// and (as root) on a kernel map.
func TestUpdateBatchFullMap(t *testing.T) {
	for name, newMap := range map[string]func(t *testing.T) bpf.Map{
		"fake":   func(*testing.T) bpf.Map { return bpffake.NewFakeMap(bpf.KeySizeV4, 1, 3) },
		"kernel": func(t *testing.T) bpf.Map { return bpf.OpenTestMap(t, bpf.LPMSpec("full_map", bpf.KeySizeV4, 1, 3)) },
	} {
		t.Run(name, func(t *testing.T) {
			m := newMap(t)
			ops := bpf.NewOps[*bpf.TestEntry](nil)
			ops.SetMap("full_map", m)
			var es []*bpf.TestEntry
			for _, p := range bpf.V4Prefixes(0, 5) {
				key, _ := bpf.EncodePrefix(p)
				es = append(es, bpf.NewTestEntry("full_map", key, bpf.IPMasqValue()))
			}
			batch := bpf.BatchOf(es...)
			ops.UpdateBatch(context.Background(), nil, batch)
			for i, be := range batch {
				if i < 3 && be.Result != nil {
					t.Errorf("entry %d: %v", i, be.Result)
				}
				if i >= 3 && !errors.Is(be.Result, unix.ENOSPC) {
					t.Errorf("entry %d: %v, want ENOSPC", i, be.Result)
				}
			}
			if keys, err := bpf.Keys(m); err != nil || len(keys) != 3 {
				t.Errorf("map holds %d keys (%v), want 3", len(keys), err)
			}
		})
	}
}

func TestDeleteBatchMissingKeyIsSuccess(t *testing.T) {
	ops, v4, _ := newFakeOps()
	es := bpf.V4Entries(t, "10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32", "10.0.0.4/32")
	for _, e := range []*bpf.TestEntry{es[0], es[2], es[3]} {
		if err := ops.Update(context.Background(), nil, 0, e); err != nil {
			t.Fatal(err)
		}
	}
	bad := bpf.NewTestEntry(bpf.IPMasqV4MapName, bpf.BadPrefixLenKey(), bpf.IPMasqValue())
	batch := bpf.BatchOf(es[0], es[1], bad, es[2], es[3])
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
	if v4.Len() != 0 {
		t.Errorf("%d entries left", v4.Len())
	}
}

func TestSingleOps(t *testing.T) {
	ops, v4, _ := newFakeOps()
	ctx := context.Background()
	e := bpf.V4Entries(t, "10.0.0.0/8")[0]
	if err := ops.Update(ctx, nil, 0, e); err != nil {
		t.Fatal(err)
	}
	if v, ok := v4.Get(e.MapKey()); !ok || v[0] != 1 {
		t.Fatalf("lookup: %v %v", v, ok)
	}
	if err := ops.Delete(ctx, nil, 0, e); err != nil {
		t.Fatal(err)
	}
	if err := ops.Delete(ctx, nil, 0, e); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	if err := ops.Update(ctx, nil, 0, bpf.NewTestEntry("", nil, nil)); err != nil {
		t.Fatalf("entry with no map: %v", err)
	}
	err := ops.Update(ctx, nil, 0, bpf.NewTestEntry("nope", e.MapKey(), e.MapValue()))
	if err == nil || !strings.Contains(err.Error(), "map nope not open") {
		t.Fatalf("unknown map: %v", err)
	}
	bad := bpf.NewTestEntry(bpf.IPMasqV4MapName, bpf.BadPrefixLenKey(), bpf.IPMasqValue())
	err = ops.Update(ctx, nil, 0, bad)
	if !errors.Is(err, unix.EINVAL) || !strings.Contains(err.Error(), "update cilium_ipmasq_v4 key") {
		t.Fatalf("bad key: %v", err)
	}
	err = ops.Update(ctx, nil, 0, bpf.NewTestEntry(bpf.IPMasqV4MapName, e.MapKey(), []byte{1, 2}))
	if err == nil || !strings.Contains(err.Error(), "value of 2 bytes, map takes 1") {
		t.Fatalf("wrong value size: %v", err)
	}
}

func TestBatchCancelledContext(t *testing.T) {
	ops, v4, _ := newFakeOps()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	batch := bpf.BatchOf(bpf.V4Entries(t, "10.0.0.1/32", "10.0.0.2/32")...)
	ops.UpdateBatch(ctx, nil, batch)
	for _, be := range batch {
		if !errors.Is(be.Result, context.Canceled) {
			t.Errorf("result %v, want context.Canceled", be.Result)
		}
	}
	if v4.Len() != 0 {
		t.Errorf("%d entries written after cancel", v4.Len())
	}
}

// notSupportedMap refuses batch operations like an old kernel.
type notSupportedMap struct{ *bpffake.FakeMap }

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
	m := notSupportedMap{bpffake.NewFakeMap(bpf.KeySizeV4, 1, 8)}
	ops := bpf.NewOps[*bpf.TestEntry](nil)
	ops.SetMap(bpf.IPMasqV4MapName, m)
	bad := bpf.NewTestEntry(bpf.IPMasqV4MapName, bpf.BadPrefixLenKey(), bpf.IPMasqValue())
	es := bpf.V4Entries(t, "10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32")
	batch := bpf.BatchOf(es[0], bad, es[1], es[2])
	ops.UpdateBatch(context.Background(), nil, batch)
	if batch[0].Result != nil || batch[2].Result != nil || batch[3].Result != nil || !errors.Is(batch[1].Result, unix.EINVAL) {
		t.Fatalf("results %v %v %v %v", batch[0].Result, batch[1].Result, batch[2].Result, batch[3].Result)
	}
	// Prune walks keys one by one and deletes one by one.
	if err := ops.Prune(context.Background(), nil, bpf.EntrySeq(es[1])); err != nil {
		t.Fatal(err)
	}
	if m.Len() != 1 {
		t.Fatalf("%d entries after prune, want 1", m.Len())
	}
	if _, ok := m.Get(es[1].MapKey()); !ok {
		t.Fatal("desired key pruned")
	}
}

func TestPruneDeletesOnlyUndesired(t *testing.T) {
	ops, v4, v6 := newFakeOps()
	ctx := context.Background()
	all := bpf.V4Entries(t, "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fe80::/10", "100::/64")
	for _, e := range all {
		if err := ops.Update(ctx, nil, 0, e); err != nil {
			t.Fatal(err)
		}
	}
	// A key written by someone else with host bits set: it is the same trie
	// node as the desired 10.0.0.0/8 and must stay.
	if err := v4.Put(bpf.KernelKey(8, 10, 1, 2, 3), []byte{1}); err != nil {
		t.Fatal(err)
	}
	desired := []*bpf.TestEntry{all[0], all[3], bpf.NewTestEntry("", nil, nil), bpf.NewTestEntry("cilium_other", all[1].MapKey(), all[1].MapValue())}
	if err := ops.Prune(ctx, nil, bpf.EntrySeq(desired...)); err != nil {
		t.Fatal(err)
	}
	got := slices.Sorted(func(yield func(string) bool) {
		for p := range bpf.MapPrefixes(t, v4) {
			yield(p.String())
		}
		for p := range bpf.MapPrefixes(t, v6) {
			yield(p.String())
		}
	})
	want := []string{"10.0.0.0/8", "fe80::/10"}
	if !slices.Equal(got, want) {
		t.Fatalf("after prune: %v, want %v", got, want)
	}
}

func TestSetMapConcurrentWithOps(t *testing.T) {
	ops := bpf.NewOps[*bpf.TestEntry](map[string]*ebpf.Map{bpf.IPMasqV4MapName: nil})
	e := bpf.V4Entries(t, "10.0.0.0/8")[0]
	if err := ops.Update(context.Background(), nil, 0, e); err == nil {
		t.Fatal("nil map was registered")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			ops.SetMap(bpf.IPMasqV4MapName, bpffake.NewFakeMap(bpf.KeySizeV4, 1, 8))
		}
	}()
	for range 100 {
		_ = ops.Update(context.Background(), nil, 0, e)
	}
	<-done
	ops.SetMap(bpf.IPMasqV4MapName, nil)
	if err := ops.Update(context.Background(), nil, 0, e); err == nil {
		t.Fatal("removed map still used")
	}
}
