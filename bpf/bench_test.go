package bpf

import (
	"bytes"
	"context"
	"errors"
	"iter"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"

	"github.com/enimasq/enimasq/cells/celltest"
)

const benchEntries = IPMasqMaxEntries

// benchRoundSize is the reconciler's round size in the benchmarks. Rounds of
// about a thousand objects were measured faster here than one round of all
// 16384: the reconciler's per-round result map and status write
// transaction stay small, and each BPF batch is still large.
const benchRoundSize = 1024

// benchOptions tune the reconciler for throughput: rounds are not rate
// limited (the default limiter allows 1000 rounds/s, which puts 1 ms on
// every change and 16 ms on 16 rounds).
func benchOptions() []reconciler.Option {
	return []reconciler.Option{
		reconciler.WithRoundLimits(benchRoundSize, rate.NewLimiter(rate.Inf, 1)),
		reconciler.WithoutPruning(),
	}
}

// newBenchMap creates an empty, unpinned cilium_ipmasq_v4-like map.
func newBenchMap(b *testing.B) *ebpf.Map {
	b.Helper()
	m, err := NewUnpinnedMap(IPMasqV4Spec())
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// benchEntrySet returns benchEntries distinct v4 entries with fresh pending
// statuses, and the same keys and values pre-encoded in batch buffers.
func benchEntrySet(b *testing.B) ([]*testEntry, batchBuf, batchBuf) {
	entries := make([]*testEntry, benchEntries)
	keys := newBatchBuf(KeySizeV4, benchEntries)
	values := newBatchBuf(1, benchEntries)
	for i, p := range v4Prefixes(0, benchEntries) {
		entries[i] = newPrefixEntry(b, p)
		keys.set(i, entries[i].MapKey())
		values.set(i, entries[i].MapValue())
	}
	return entries, keys, values
}

// nopOps succeeds without touching any map: with it, a run measures the
// table and the reconciler alone.
type nopOps struct{}

func (nopOps) Update(context.Context, statedb.ReadTxn, statedb.Revision, *testEntry) error {
	return nil
}
func (nopOps) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *testEntry) error {
	return nil
}
func (nopOps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*testEntry, statedb.Revision]) error {
	return nil
}
func (nopOps) UpdateBatch(context.Context, statedb.ReadTxn, []reconciler.BatchEntry[*testEntry]) {}
func (nopOps) DeleteBatch(context.Context, statedb.ReadTxn, []reconciler.BatchEntry[*testEntry]) {}

// timedOps measures the time spent in the batch operations: our code and
// the kernel's, the part of a statedb run that Ops is responsible for.
type timedOps struct {
	ReconcilerOps[*testEntry]
	spent time.Duration // written by the reconciler goroutine only
}

func (t *timedOps) UpdateBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*testEntry]) {
	start := time.Now()
	t.ReconcilerOps.UpdateBatch(ctx, txn, batch)
	t.spent += time.Since(start)
}

// timeInitialSync inserts entries in one transaction into a fresh table
// reconciled with ops and returns the time from the commit until every object
// is Done. With
// nsPerOp, that time is also what the benchmark reports as ns/op.
func timeInitialSync(b *testing.B, ops ReconcilerOps[*testEntry], entries []*testEntry, nsPerOp bool) time.Duration {
	b.Helper()
	h := startReconciler(b, ops, benchOptions()...)
	defer h.stop()
	runtime.GC()
	// The clock starts when the rows are committed: the issue measures
	// "from rows committed to the table until every entry is Done". The
	// reconciler sees nothing before the commit.
	rev := h.insert(entries...)
	if nsPerOp {
		b.StartTimer()
	}
	start := time.Now()
	h.waitReconciled(b, rev)
	elapsed := time.Since(start)
	b.StopTimer()
	checkAllDone(b, h, len(entries))
	return elapsed
}

// BenchmarkInitialSync16384 compares filling an empty map with 16384 entries
// through statedb (insert in one transaction, wait until the reconciler has
// marked every object Done) with the floor: one raw BatchUpdate of the same
// pre-encoded keys.
//
// ns/op is the statedb path; x-floor is its ratio to the floor. ops-x-floor
// is the time spent inside UpdateBatch (this package and the kernel) over the
// floor. nop-x-floor is the same statedb run with operations that do
// nothing, over the floor: the share of the table and the reconciler, which
// no map operation can win back.
func BenchmarkInitialSync16384(b *testing.B) {
	celltest.MountBPFFS(b) // each benchmark has its own bpffs, like the agent's maps
	var floor, statedbTime, opsTime, nopTime time.Duration
	b.ResetTimer()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		entries, keys, values := benchEntrySet(b)

		// Floor: the kernel work alone.
		raw := newBenchMap(b)
		runtime.GC()
		start := time.Now()
		n, err := raw.BatchUpdate(keys.from(0), values.from(0), nil)
		floor += time.Since(start)
		raw.Close()
		if err != nil || n != benchEntries {
			b.Fatalf("raw BatchUpdate: %d, %v", n, err)
		}

		// statedb: table, reconciler, Ops, map.
		m := newBenchMap(b)
		ops := &timedOps{ReconcilerOps: NewOps[*testEntry](map[string]*ebpf.Map{IPMasqV4MapName: m})}
		statedbTime += timeInitialSync(b, ops, entries, true)
		opsTime += ops.spent // read after the reconciler reported the revision done
		if got := countKeys(b, m); got != benchEntries {
			b.Fatalf("map holds %d keys, want %d", got, benchEntries)
		}
		m.Close()

		// statedb with no map: the bound set by the table and reconciler.
		entries, _, _ = benchEntrySet(b)
		nopTime += timeInitialSync(b, nopOps{}, entries, false)
	}
	b.ReportMetric(float64(floor.Nanoseconds())/float64(b.N), "floor-ns/op")
	b.ReportMetric(float64(statedbTime)/float64(floor), "x-floor")
	b.ReportMetric(float64(opsTime)/float64(floor), "ops-x-floor")
	b.ReportMetric(float64(nopTime)/float64(floor), "nop-x-floor")
}

func checkAllDone(b *testing.B, h *harness, want int) {
	b.Helper()
	done := 0
	for e := range h.table.All(h.db.ReadTxn()) {
		if e.Status.Kind == reconciler.StatusKindDone {
			done++
		}
	}
	if done != want {
		b.Fatalf("%d objects Done, want %d", done, want)
	}
}

func countKeys(b *testing.B, m Map) int {
	b.Helper()
	keys, err := listKeys(m)
	if err != nil {
		b.Fatal(err)
	}
	return keys.len()
}

// BenchmarkOneChange changes the value of one entry out of 16384 and
// measures the time and the map operations to bring the map in step: with
// statedb (the reconciler writes the one changed object: 1 operation) and
// with two peer algorithms over the full desired state:
//
//   - bulk refresh (aws-ebpf-sdk-go BulkRefreshMapEntries): update every
//     desired key, list every key in the map, delete the stale ones;
//   - dump and diff (Cilium's ip-masq-agent): dump the map, diff it against
//     the desired state, apply the difference.
//
// A map operation is one element operation in the kernel (a batch of n
// counts n; a dump counts its get-next-key and its lookup per entry).
func BenchmarkOneChange(b *testing.B) {
	celltest.MountBPFFS(b)
	entries, _, _ := benchEntrySet(b)

	ours := &countingMap{Map: newBenchMap(b)}
	defer ours.Close()
	ops := NewOps[*testEntry](nil)
	ops.SetMap(IPMasqV4MapName, ours)
	h := startReconciler(b, ops, benchOptions()...)
	h.waitReconciled(b, h.insert(entries...))

	desired := newDesiredState(entries)
	bulk := &countingMap{Map: newBenchMap(b)}
	defer bulk.Close()
	dump := &countingMap{Map: newBenchMap(b)}
	defer dump.Close()
	for _, m := range []*countingMap{bulk, dump} {
		if err := bulkRefresh(m, desired); err != nil {
			b.Fatal(err)
		}
	}

	target := entries[benchEntries/2]
	var oursTime, bulkTime, dumpTime time.Duration
	var oursOps, bulkOps, dumpOps int64
	b.ResetTimer()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		value := []byte{byte(2 + i%2)} // differs from the value in place
		changed := target.withValue(value)
		desired.set(target.MapKey(), value)

		// Each run starts from a collected heap, so that none pays for
		// the garbage of another.
		runtime.GC()
		ours.reset()
		b.StartTimer()
		start := time.Now()
		h.waitReconciled(b, h.insert(changed))
		oursTime += time.Since(start)
		b.StopTimer()
		oursOps += ours.ops()

		runtime.GC()
		bulk.reset()
		start = time.Now()
		if err := bulkRefresh(bulk, desired); err != nil {
			b.Fatal(err)
		}
		bulkTime += time.Since(start)
		bulkOps += bulk.ops()

		runtime.GC()
		dump.reset()
		start = time.Now()
		if err := dumpAndDiff(dump, desired); err != nil {
			b.Fatal(err)
		}
		dumpTime += time.Since(start)
		dumpOps += dump.ops()
	}

	if oursOps != int64(b.N) {
		b.Fatalf("statedb made %d map operations for %d changes, want 1 per change", oursOps, b.N)
	}
	var v uint8
	if err := ours.Map.Lookup(target.MapKey(), &v); err != nil || v != byte(2+(b.N-1)%2) {
		b.Fatalf("changed entry: value %d, %v", v, err)
	}
	n := float64(b.N)
	b.ReportMetric(float64(oursOps)/n, "map-ops/op")
	b.ReportMetric(float64(bulkOps)/n, "bulk-refresh-map-ops/op")
	b.ReportMetric(float64(dumpOps)/n, "dump-diff-map-ops/op")
	b.ReportMetric(float64(bulkTime.Nanoseconds())/n, "bulk-refresh-ns/op")
	b.ReportMetric(float64(dumpTime.Nanoseconds())/n, "dump-diff-ns/op")
	b.ReportMetric(float64(bulkTime)/float64(oursTime), "x-faster-than-bulk-refresh")
	b.ReportMetric(float64(dumpTime)/float64(oursTime), "x-faster-than-dump-diff")
}

// desiredState is the full desired content of a map, as the peer
// algorithms take it.
type desiredState struct {
	keys   [][]byte
	values [][]byte
	index  map[string]int
}

func newDesiredState(entries []*testEntry) *desiredState {
	d := &desiredState{index: make(map[string]int, len(entries))}
	for i, e := range entries {
		d.keys = append(d.keys, e.MapKey())
		d.values = append(d.values, e.MapValue())
		d.index[string(e.MapKey())] = i
	}
	return d
}

func (d *desiredState) set(key, value []byte) { d.values[d.index[string(key)]] = value }

func (d *desiredState) value(key []byte) ([]byte, bool) {
	i, ok := d.index[string(key)]
	if !ok {
		return nil, false
	}
	return d.values[i], true
}

// bulkRefresh is aws-ebpf-sdk-go's BulkRefreshMapEntries: update every
// desired entry one by one, list all keys, delete those not desired.
func bulkRefresh(m *countingMap, d *desiredState) error {
	for i, key := range d.keys {
		if err := m.Put(key, d.values[i]); err != nil {
			return err
		}
	}
	var stale [][]byte
	if err := walkAll(m, func(key []byte) error {
		if _, ok := d.value(key); !ok {
			stale = append(stale, bytes.Clone(key))
		}
		return nil
	}); err != nil {
		return err
	}
	for _, key := range stale {
		if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// dumpAndDiff is Cilium's ip-masq-agent: dump the map (key and value of
// every entry), diff against the desired state, apply the difference.
func dumpAndDiff(m *countingMap, d *desiredState) error {
	current := make(map[string][]byte, len(d.keys))
	value := make([]byte, m.ValueSize())
	if err := walkAll(m, func(key []byte) error {
		if err := m.Lookup(key, value); err != nil {
			return err
		}
		current[string(key)] = bytes.Clone(value)
		return nil
	}); err != nil {
		return err
	}
	for i, key := range d.keys {
		if cur, ok := current[string(key)]; !ok || !bytes.Equal(cur, d.values[i]) {
			if err := m.Put(key, d.values[i]); err != nil {
				return err
			}
		}
	}
	for key := range current {
		if _, ok := d.value([]byte(key)); !ok {
			if err := m.Delete([]byte(key)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
		}
	}
	return nil
}

// walkAll calls fn for every key, one get-next-key syscall per key.
func walkAll(m *countingMap, fn func(key []byte) error) error {
	key := make([]byte, m.KeySize())
	var prev any
	for {
		err := m.NextKey(prev, key)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(key); err != nil {
			return err
		}
		prev = bytes.Clone(key)
	}
}
