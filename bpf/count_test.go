package bpf

import (
	"context"
	"encoding/binary"
	"iter"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
)

const countSpillMap = "test_chunks"

// spillingEntry is a testEntry whose value continues in chunks of
// countSpillMap.
type spillingEntry struct {
	*testEntry
	chunks []SpillEntry
}

func (e *spillingEntry) SpillMap() string    { return countSpillMap }
func (e *spillingEntry) Spill() []SpillEntry { return e.chunks }

func countChunk(id uint64) SpillEntry {
	key := binary.LittleEndian.AppendUint64(nil, id)
	return SpillEntry{Key: key, Value: binary.LittleEndian.AppendUint64(nil, ^id)}
}

func newSpillingEntry(tb testing.TB, prefix string, chunks ...uint64) *spillingEntry {
	e := &spillingEntry{testEntry: newPrefixEntry(tb, netip.MustParsePrefix(prefix))}
	for _, c := range chunks {
		e.chunks = append(e.chunks, countChunk(c))
	}
	return e
}

func spillObjects(es ...*spillingEntry) iter.Seq2[*spillingEntry, statedb.Revision] {
	return func(yield func(*spillingEntry, statedb.Revision) bool) {
		for _, e := range es {
			if !yield(e, 0) {
				return
			}
		}
	}
}

// SpillEntries is the number of distinct chunks the kernel holds, at every
// step: chunks left by a previous run (counted when the map is set),
// chunks shared by entries (once), chunks that go with their entry, chunks
// a prune deletes, a full map.
func TestPrivilegedSpillEntriesCountsTheKernelsChunks(t *testing.T) {
	dir := GlobalsDir(celltest.MountBPFFS(t))
	lpm := openPinnedForTest(t, IPMasqV4Spec(), dir)
	chunks := openPinnedForTest(t, &ebpf.MapSpec{Name: countSpillMap, Type: ebpf.Hash, KeySize: 8, ValueSize: 8,
		MaxEntries: 6, Flags: unix.BPF_F_NO_PREALLOC}, dir)
	kernel := func() int {
		keys, err := listKeys(chunks)
		if err != nil {
			t.Fatal(err)
		}
		return keys.len()
	}
	var ops *Ops[*spillingEntry]
	check := func(step string) {
		t.Helper()
		n, ok := ops.SpillEntries(countSpillMap)
		if want := kernel(); !ok || n != want {
			t.Errorf("%s: SpillEntries = %d, %t; the kernel holds %d", step, n, ok, want)
		}
	}

	// A previous run left two chunks.
	for _, c := range []uint64{100, 101} {
		se := countChunk(c)
		if err := chunks.Put(se.Key, se.Value); err != nil {
			t.Fatal(err)
		}
	}
	ops = NewOps[*spillingEntry](map[string]*ebpf.Map{IPMasqV4MapName: lpm})
	if _, ok := ops.SpillEntries(countSpillMap); ok {
		t.Errorf("SpillEntries of a map not set: ok")
	}
	ops.SetSpillMap(countSpillMap)
	ops.SetMap(countSpillMap, chunks)
	check("set")

	ctx := context.Background()
	a := newSpillingEntry(t, "10.0.0.0/8", 1, 2)
	b := newSpillingEntry(t, "10.1.0.0/16", 2, 3) // shares chunk 2 with a
	if err := ops.Update(ctx, nil, 0, a); err != nil {
		t.Fatal(err)
	}
	batch := []reconciler.BatchEntry[*spillingEntry]{{Object: b}}
	ops.UpdateBatch(ctx, nil, batch)
	if batch[0].Result != nil {
		t.Fatal(batch[0].Result)
	}
	check("written") // 100, 101, 1, 2, 3
	if n, _ := ops.SpillEntries(countSpillMap); n != 5 {
		t.Errorf("written: %d chunks, want 5", n)
	}

	// Deleting an entry deletes the chunks no other entry holds (1; b
	// holds 2); the prune deletes the previous run's.
	if err := ops.Delete(ctx, nil, 0, a); err != nil {
		t.Fatal(err)
	}
	check("entry deleted") // 100, 101, 2, 3
	if n, _ := ops.SpillEntries(countSpillMap); n != 4 {
		t.Errorf("entry deleted: %d chunks, want 4", n)
	}
	if err := ops.Prune(ctx, nil, spillObjects(b)); err != nil {
		t.Fatal(err)
	}
	check("pruned") // 2, 3
	if n, _ := ops.SpillEntries(countSpillMap); n != 2 {
		t.Errorf("pruned: %d chunks, want 2", n)
	}

	// Rewriting chunks the kernel holds counts them once; a full map
	// counts what it took.
	c := newSpillingEntry(t, "10.2.0.0/16", 2, 3, 4, 5, 6, 7, 8)
	if err := ops.Update(ctx, nil, 0, c); err == nil {
		t.Errorf("7 chunks in a map of 6: no error")
	}
	check("full")
	if n, _ := ops.SpillEntries(countSpillMap); n != 6 {
		t.Errorf("full: %d chunks, want 6", n)
	}

	ops.SetMap(countSpillMap, nil)
	if _, ok := ops.SpillEntries(countSpillMap); ok {
		t.Errorf("SpillEntries of a closed map: ok")
	}
}

// A chunk goes as soon as the last entry the kernel holds with it is
// deleted or rewritten without it, and not before: a chunk shared by two
// entries stays while either holds it; a chunk that moves from one entry
// to another within a batch is never deleted; an entry whose write fails
// keeps the chunks of the value the kernel still holds; a chunk that went
// and comes back is written again.
func TestPrivilegedChunksGoWithTheirEntries(t *testing.T) {
	dir := GlobalsDir(celltest.MountBPFFS(t))
	lpm := openPinnedForTest(t, IPMasqV4Spec(), dir)
	chunks := openPinnedForTest(t, &ebpf.MapSpec{Name: countSpillMap, Type: ebpf.Hash, KeySize: 8, ValueSize: 8,
		MaxEntries: 4, Flags: unix.BPF_F_NO_PREALLOC}, dir)
	ops := NewOps[*spillingEntry](map[string]*ebpf.Map{IPMasqV4MapName: lpm})
	ops.SetSpillMap(countSpillMap)
	ops.SetMap(countSpillMap, chunks)
	ctx := context.Background()
	holds := func(step string, want ...uint64) {
		t.Helper()
		keys, err := listKeys(chunks)
		if err != nil {
			t.Fatal(err)
		}
		got := map[uint64]bool{}
		for j := range keys.len() {
			got[binary.LittleEndian.Uint64(keys.at(j))] = true
		}
		ok := len(got) == len(want)
		for _, w := range want {
			ok = ok && got[w]
		}
		if !ok {
			t.Errorf("%s: the chunk map holds %v, want %v", step, got, want)
		}
		if n, _ := ops.SpillEntries(countSpillMap); n != len(got) {
			t.Errorf("%s: SpillEntries = %d, the kernel holds %d", step, n, len(got))
		}
	}
	update := func(es ...*spillingEntry) []reconciler.BatchEntry[*spillingEntry] {
		batch := make([]reconciler.BatchEntry[*spillingEntry], len(es))
		for i, e := range es {
			batch[i].Object = e
		}
		ops.UpdateBatch(ctx, nil, batch)
		return batch
	}

	a := newSpillingEntry(t, "10.0.0.0/8", 1, 2)
	b := newSpillingEntry(t, "10.1.0.0/16", 2, 3)
	for _, be := range update(a, b) {
		if be.Result != nil {
			t.Fatal(be.Result)
		}
	}
	holds("written", 1, 2, 3)
	if err := ops.Delete(ctx, nil, 0, a); err != nil {
		t.Fatal(err)
	}
	holds("a deleted: 2 is b's too", 2, 3)

	// b rewritten with other chunks: 2 goes; 3 moves to c in the same batch.
	b2 := newSpillingEntry(t, "10.1.0.0/16", 4)
	c := newSpillingEntry(t, "10.2.0.0/16", 3)
	for _, be := range update(b2, c) {
		if be.Result != nil {
			t.Fatal(be.Result)
		}
	}
	holds("b rewritten, 3 moved to c", 3, 4)

	// A write that fails keeps what the kernel holds: c's new value has
	// more chunks than the map takes, so c keeps its old value and 3.
	cFull := newSpillingEntry(t, "10.2.0.0/16", 5, 6, 7, 8)
	if err := ops.Update(ctx, nil, 0, cFull); err == nil {
		t.Fatal("4 new chunks in a map of 4 holding 2: no error")
	}
	if err := ops.Delete(ctx, nil, 0, b2); err != nil {
		t.Fatal(err)
	}
	keys, err := listKeys(chunks)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint64]bool{}
	for j := range keys.len() {
		got[binary.LittleEndian.Uint64(keys.at(j))] = true
	}
	if !got[3] || got[4] {
		t.Errorf("after a failed write of c and b deleted: the chunk map holds %v, want 3 (c's, in the kernel) and not 4", got)
	}
	if err := ops.Prune(ctx, nil, spillObjects(c)); err != nil {
		t.Fatal(err)
	}
	holds("pruned", 3)

	// A chunk that went comes back with a new entry: written again.
	if err := ops.Delete(ctx, nil, 0, c); err != nil {
		t.Fatal(err)
	}
	holds("c deleted")
	d := newSpillingEntry(t, "10.3.0.0/16", 3)
	if err := ops.Update(ctx, nil, 0, d); err != nil {
		t.Fatal(err)
	}
	holds("d written", 3)
}

// A chunk the map held when it was set may be held by an entry this run
// never wrote (an earlier run's version in force): an entry of this run
// that writes and deletes it does not take it along; the prune decides.
func TestPrivilegedChunksOfAnEarlierRunStay(t *testing.T) {
	dir := GlobalsDir(celltest.MountBPFFS(t))
	lpm := openPinnedForTest(t, IPMasqV4Spec(), dir)
	chunks := openPinnedForTest(t, &ebpf.MapSpec{Name: countSpillMap, Type: ebpf.Hash, KeySize: 8, ValueSize: 8,
		MaxEntries: 4, Flags: unix.BPF_F_NO_PREALLOC}, dir)
	se := countChunk(100)
	if err := chunks.Put(se.Key, se.Value); err != nil {
		t.Fatal(err)
	}
	ops := NewOps[*spillingEntry](map[string]*ebpf.Map{IPMasqV4MapName: lpm})
	ops.SetSpillMap(countSpillMap)
	ops.SetMap(countSpillMap, chunks)
	ctx := context.Background()
	e := newSpillingEntry(t, "10.0.0.0/8", 100, 1)
	if err := ops.Update(ctx, nil, 0, e); err != nil {
		t.Fatal(err)
	}
	if err := ops.Delete(ctx, nil, 0, e); err != nil {
		t.Fatal(err)
	}
	var v []byte
	if err := chunks.Lookup(se.Key, &v); err != nil {
		t.Errorf("the earlier run's chunk went with an entry of this run: %v", err)
	}
	if err := chunks.Lookup(countChunk(1).Key, &v); err == nil {
		t.Errorf("this run's own chunk stayed after its last entry")
	}
	if err := ops.Prune(ctx, nil, spillObjects()); err != nil {
		t.Fatal(err)
	}
	if err := chunks.Lookup(se.Key, &v); err == nil {
		t.Errorf("the prune kept a chunk no entry desires")
	}
}
