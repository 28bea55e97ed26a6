package bpf

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/cells/celltest"
)

// openTestMap creates and pins a map of spec in a fresh bpffs.
func openTestMap(tb testing.TB, spec *ebpf.MapSpec) *ebpf.Map {
	tb.Helper()
	return openPinnedForTest(tb, spec, GlobalsDir(celltest.MountBPFFS(tb)))
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testEntry is a table row that is one entry of a BPF map. It is kept small
// (one allocation for all its bytes) because the reconciler clones every
// object it processes.
type testEntry struct {
	Map    string
	data   []byte // primary key (map name, NUL, key bytes), then the value
	keyOff uint16
	valOff uint16
	Status reconciler.Status
}

func newTestEntry(mapName string, key, value []byte) *testEntry {
	data := make([]byte, 0, len(mapName)+1+len(key)+len(value))
	data = append(append(append(append(data, mapName...), 0), key...), value...)
	return &testEntry{
		Map:    mapName,
		data:   data,
		keyOff: uint16(len(mapName) + 1),
		valOff: uint16(len(mapName) + 1 + len(key)),
		Status: reconciler.StatusPending(),
	}
}

// withValue returns a pending copy of e with another value.
func (e *testEntry) withValue(value []byte) *testEntry {
	return newTestEntry(e.Map, e.MapKey(), value)
}

func (e *testEntry) id() []byte { return e.data[:e.valOff] }

// prefix decodes the key of an address map entry.
func (e *testEntry) prefix() netip.Prefix {
	p, _ := decodeAnyKey(e.MapKey())
	return p
}

// newPrefixEntry is the entry of p in the map of its family.
func newPrefixEntry(tb testing.TB, p netip.Prefix) *testEntry {
	tb.Helper()
	key, err := EncodePrefix(p)
	if err != nil {
		tb.Fatalf("EncodePrefix(%s): %v", p, err)
	}
	name := IPMasqV4MapName
	if len(key) == KeySizeV6 {
		name = IPMasqV6MapName
	}
	return newTestEntry(name, key, IPMasqValue())
}

func decodeAnyKey(key []byte) (netip.Prefix, error) {
	if len(key) == KeySizeV6 {
		return UnmarshalKey(IPv6, key)
	}
	return UnmarshalKey(IPv4, key)
}

func (e *testEntry) MapName() string  { return e.Map }
func (e *testEntry) MapKey() []byte   { return e.data[e.keyOff:e.valOff:e.valOff] }
func (e *testEntry) MapValue() []byte { return e.data[e.valOff:] }

func (e *testEntry) TableHeader() []string { return []string{"Map", "Key", "Value", "Status"} }
func (e *testEntry) TableRow() []string {
	return []string{e.Map, describeKey(e.MapKey()), fmt.Sprintf("%x", e.MapValue()), e.Status.Kind.String()}
}

func (e *testEntry) Clone() *testEntry { e2 := *e; return &e2 }
func (e *testEntry) GetStatus() reconciler.Status {
	return e.Status
}
func (e *testEntry) SetStatus(s reconciler.Status) *testEntry {
	e.Status = s
	return e
}

var testEntryIndex = statedb.Index[*testEntry, []byte]{
	Name:       "id",
	FromObject: func(e *testEntry) index.KeySet { return index.NewKeySet(e.id()) },
	FromKey:    func(k []byte) index.Key { return k },
	Unique:     true,
}

// harness is a running hive with a table of testEntry and a reconciler.
type harness struct {
	db    *statedb.DB
	table statedb.RWTable[*testEntry]
	rec   reconciler.Reconciler[*testEntry]
	stop  func()
}

// startReconciler starts a hive whose reconciler applies ops (as single and
// batch operations) to the rows of a fresh table, and waits until the
// reconciler has done its first round. The hive stops with tb, or earlier
// with h.stop.
func startReconciler(tb testing.TB, ops ReconcilerOps[*testEntry], opts ...reconciler.Option) *harness {
	tb.Helper()
	var h harness
	hv := hive.New(
		statedb.Cell,
		job.Cell,
		cell.SimpleHealthCell,
		cell.Module("bpf-test", "BPF map reconciler under test",
			cell.Provide(func(r job.Registry, health cell.Health) job.Group { return r.NewGroup(health) }),
			cell.Invoke(func(p reconciler.Params) error {
				tbl, err := statedb.NewTable(p.DB, "test-map-entries", testEntryIndex)
				if err != nil {
					return err
				}
				all := append([]reconciler.Option{
					reconciler.WithMetrics(reconciler.NewUnpublishedExpVarMetrics()),
				}, opts...)
				rec, err := reconciler.Register(p, tbl,
					(*testEntry).Clone, (*testEntry).SetStatus, (*testEntry).GetStatus,
					ops, ops, all...)
				if err != nil {
					return err
				}
				h.db, h.table, h.rec = p.DB, tbl, rec
				return nil
			}),
		),
	)
	log := hivetest.Logger(tb, hivetest.LogLevel(slog.LevelError))
	if err := hv.Start(log, context.Background()); err != nil {
		tb.Fatalf("start hive: %v", err)
	}
	var once sync.Once
	h.stop = func() {
		once.Do(func() {
			if err := hv.Stop(log, context.Background()); err != nil {
				tb.Errorf("stop hive: %v", err)
			}
		})
	}
	tb.Cleanup(h.stop)

	// A row that no map takes goes through a whole round and out again.
	warmup := newTestEntry("", []byte("warm-up"), nil)
	h.waitReconciled(tb, h.insert(warmup))
	h.waitReconciled(tb, h.delete(warmup))
	return &h
}

// insert inserts the entries in one transaction and returns its revision.
func (h *harness) insert(entries ...*testEntry) statedb.Revision {
	wtxn := h.db.WriteTxn(h.table)
	defer wtxn.Abort()
	for _, e := range entries {
		h.table.Insert(wtxn, e)
	}
	rev := h.table.Revision(wtxn)
	wtxn.Commit()
	return rev
}

// delete deletes the entries in one transaction and returns its revision.
func (h *harness) delete(entries ...*testEntry) statedb.Revision {
	wtxn := h.db.WriteTxn(h.table)
	defer wtxn.Abort()
	for _, e := range entries {
		h.table.Delete(wtxn, e)
	}
	rev := h.table.Revision(wtxn)
	wtxn.Commit()
	return rev
}

// waitFor waits, watching the table, until cond holds for its rows.
func (h *harness) waitFor(tb testing.TB, what string, cond func(rows []*testEntry) bool) []*testEntry {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		iter, watch := h.table.AllWatch(h.db.ReadTxn())
		rows := statedb.Collect(iter)
		if cond(rows) {
			return rows
		}
		select {
		case <-watch:
		case <-ctx.Done():
			for _, r := range rows {
				tb.Logf("row %v %s", r.TableRow(), r.Status.GetError())
			}
			tb.Fatalf("timed out waiting for %s", what)
		}
	}
}

// waitReconciled waits until the reconciler has processed rev without
// leaving anything to retry.
func (h *harness) waitReconciled(tb testing.TB, rev statedb.Revision) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, low, err := h.rec.WaitUntilReconciled(ctx, rev)
	if err != nil {
		tb.Fatalf("WaitUntilReconciled(%d): %v", rev, err)
	}
	if low != 0 && low <= rev {
		tb.Fatalf("WaitUntilReconciled(%d): objects from revision %d failed", rev, low)
	}
}

// mapPrefixes lists the keys of an address map (8 or 20 byte keys).
func mapPrefixes(tb testing.TB, m Map) map[netip.Prefix]bool {
	tb.Helper()
	keys, err := listKeys(m)
	if err != nil {
		tb.Fatalf("list keys: %v", err)
	}
	out := make(map[netip.Prefix]bool, keys.len())
	for j := range keys.len() {
		p, err := decodeAnyKey(keys.at(j))
		if err != nil {
			tb.Fatalf("decode key %x: %v", keys.at(j), err)
		}
		out[p] = true
	}
	return out
}

// v4Prefixes returns n distinct /32 prefixes in 10.0.0.0/8, from start.
func v4Prefixes(start, n int) []netip.Prefix {
	out := make([]netip.Prefix, n)
	for i := range n {
		v := 10<<24 | uint32(start+i)
		out[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 32)
	}
	return out
}

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

func entrySeq(entries ...*testEntry) func(func(*testEntry, statedb.Revision) bool) {
	return func(yield func(*testEntry, statedb.Revision) bool) {
		for i, e := range entries {
			if !yield(e, statedb.Revision(i+1)) {
				return
			}
		}
	}
}
