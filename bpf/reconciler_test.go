package bpf

import (
	"bytes"
	"context"
	"errors"
	"iter"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"

	"github.com/enimasq/enimasq/cells/celltest"
)

// pruneSignal passes operations through and reports each finished Prune.
type pruneSignal struct {
	ReconcilerOps[*testEntry]
	pruned chan error
}

func (p *pruneSignal) Prune(ctx context.Context, txn statedb.ReadTxn, objects iter.Seq2[*testEntry, statedb.Revision]) error {
	err := p.ReconcilerOps.Prune(ctx, txn, objects)
	p.pruned <- err
	return err
}

func TestPrivilegedReconcilerOneBadEntry(t *testing.T) {
	dir := GlobalsDir(celltest.MountBPFFS(t))
	v4 := openPinnedForTest(t, IPMasqV4Spec(), dir)
	v6 := openPinnedForTest(t, IPMasqV6Spec(), dir)
	ops := NewOps[*testEntry](map[string]*ebpf.Map{IPMasqV4MapName: v4, IPMasqV6MapName: v6})
	faults := NewFaultInjector[*testEntry](ops)
	signal := &pruneSignal{ReconcilerOps: faults, pruned: make(chan error, 16)}
	h := startReconciler(t, signal,
		reconciler.WithRetry(5*time.Millisecond, 20*time.Millisecond),
		reconciler.WithRoundLimits(1000, rate.NewLimiter(rate.Inf, 1)),
		reconciler.WithoutPruning(),
	)

	var entries []*testEntry
	for _, p := range v4Prefixes(0, 100) {
		entries = append(entries, newPrefixEntry(t, p))
	}
	for _, s := range []string{"fe80::/10", "100::/64", "2001:db8::/32"} {
		entries = append(entries, newPrefixEntry(t, netip.MustParsePrefix(s)))
	}
	bad := entries[42]
	faults.SetFaultFunc(func(mapName string, key []byte) error {
		if mapName == bad.Map && bytes.Equal(key, bad.MapKey()) {
			return errors.New("refused by the test")
		}
		return nil
	})

	h.insert(entries...)

	rows := h.waitFor(t, "all but one Done, one Error", func(rows []*testEntry) bool {
		done, failed := 0, 0
		for _, r := range rows {
			switch r.Status.Kind {
			case reconciler.StatusKindDone:
				done++
			case reconciler.StatusKindError:
				failed++
			}
		}
		return done == len(entries)-1 && failed == 1
	})
	for _, r := range rows {
		if r.Status.Kind != reconciler.StatusKindError {
			continue
		}
		if r.prefix() != bad.prefix() {
			t.Fatalf("%s failed, want %s", r.prefix(), bad.prefix())
		}
		if msg := r.Status.GetError(); !strings.Contains(msg, "update cilium_ipmasq_v4 key 10.0.0.42/32: injected fault: refused by the test") {
			t.Fatalf("error status %q does not give the reason", msg)
		}
	}
	inMaps := mapPrefixes(t, v4)
	for p := range mapPrefixes(t, v6) {
		inMaps[p] = true
	}
	if len(inMaps) != len(entries)-1 || inMaps[bad.prefix()] {
		t.Fatalf("maps hold %d prefixes (bad one present: %v), want %d", len(inMaps), inMaps[bad.prefix()], len(entries)-1)
	}

	// Once the fault is gone, the retry brings the entry in.
	faults.SetFaultFunc(nil)
	h.waitFor(t, "the failed entry Done after the fault is removed", func(rows []*testEntry) bool {
		for _, r := range rows {
			if r.prefix() == bad.prefix() {
				return r.Status.Kind == reconciler.StatusKindDone
			}
		}
		return false
	})
	if !mapPrefixes(t, v4)[bad.prefix()] {
		t.Fatalf("%s not in the map after its retry", bad.prefix())
	}

	// Deleting rows deletes their keys, the formerly bad one included.
	gone := []*testEntry{entries[0], bad, entries[len(entries)-1]}
	h.waitReconciled(t, h.delete(gone...))
	inMaps = mapPrefixes(t, v4)
	for p := range mapPrefixes(t, v6) {
		inMaps[p] = true
	}
	if len(inMaps) != len(entries)-len(gone) {
		t.Fatalf("maps hold %d prefixes after delete, want %d", len(inMaps), len(entries)-len(gone))
	}
	for _, e := range gone {
		if inMaps[e.prefix()] {
			t.Fatalf("%s still in the map after its row was deleted", e.prefix())
		}
	}

	// A key nobody wants (left by a previous run) is pruned; the desired
	// keys stay.
	stale, _ := EncodePrefix(netip.MustParsePrefix("198.51.100.0/24"))
	if err := v4.Put(stale, uint8(1)); err != nil {
		t.Fatal(err)
	}
	h.rec.Prune()
	select {
	case err := <-signal.pruned:
		if err != nil {
			t.Fatalf("prune: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("prune did not run")
	}
	after := mapPrefixes(t, v4)
	if after[netip.MustParsePrefix("198.51.100.0/24")] {
		t.Fatal("stale key not pruned")
	}
	if wantV4 := 100 - 2; len(after) != wantV4 { // entries[0] and bad were deleted
		t.Fatalf("v4 map holds %d prefixes after prune, want %d", len(after), wantV4)
	}
}

func openPinnedForTest(tb testing.TB, spec *ebpf.MapSpec, dir string) *ebpf.Map {
	tb.Helper()
	m, err := OpenPinned(discardLogger(), spec, dir)
	if err != nil {
		tb.Fatalf("OpenPinned(%s): %v", spec.Name, err)
	}
	tb.Cleanup(func() { m.Close() })
	return m
}
