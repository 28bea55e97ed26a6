package policymap

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/celltest"
)

const (
	pressureLPM    = "test_pressure_v4"
	pressureChunks = "test_pressure_chunks"
	pressureMax    = 16
)

// pressureEntry is a row of an LPM map (a v4 prefix) whose value continues
// in chunks, as a policy entry's does.
type pressureEntry struct {
	Prefix netip.Prefix
	Chunks []uint64
	Status reconciler.Status
}

func (e *pressureEntry) MapName() string { return pressureLPM }
func (e *pressureEntry) MapKey() []byte {
	k, _ := bpf.EncodePrefix(e.Prefix)
	return k
}
func (e *pressureEntry) MapValue() []byte { return bpf.IPMasqValue() }
func (e *pressureEntry) SpillMap() string { return pressureChunks }
func (e *pressureEntry) Spill() []bpf.SpillEntry {
	var out []bpf.SpillEntry
	for _, c := range e.Chunks {
		out = append(out, bpf.SpillEntry{Key: binary.LittleEndian.AppendUint64(nil, c), Value: make([]byte, 8)})
	}
	return out
}
func (e *pressureEntry) GetStatus() reconciler.Status { return e.Status }
func (e *pressureEntry) TableHeader() []string        { return []string{"Prefix", "Status"} }
func (e *pressureEntry) TableRow() []string {
	return []string{e.Prefix.String(), e.Status.Kind.String()}
}

var pressureIndex = statedb.Index[*pressureEntry, netip.Prefix]{
	Name:       "prefix",
	FromObject: func(e *pressureEntry) index.KeySet { return index.NewKeySet(index.NetIPPrefix(e.Prefix)) },
	FromKey:    index.NetIPPrefix,
	Unique:     true,
}

// gather collects the map metrics of TableMetrics: value[name][map].
func gather(t *testing.T, cs []prometheus.Collector) map[string]map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var mapName string
			for _, l := range m.GetLabel() {
				if l.GetName() == "map" {
					mapName = l.GetValue()
				}
			}
			if out[f.GetName()] == nil {
				out[f.GetName()] = map[string]float64{}
			}
			out[f.GetName()][mapName] = m.GetGauge().GetValue()
		}
	}
	return out
}

// TableMetrics' enimasq_bpf_map_entries, _pressure and _capacity are the
// kernel's count of a real LPM map and a real chunk map in a private bpffs,
// exactly, from empty to full (ENOSPC) and after a prune.
func TestPrivilegedMapPressureIsTheKernelsCount(t *testing.T) {
	dir := bpf.GlobalsDir(celltest.MountBPFFS(t))
	log := slog.New(slog.DiscardHandler)
	maps := NewMaps[*pressureEntry](MapsParams{Config: DefaultConfig, Store: bpf.KernelStore{}}, "pressure-test")
	if err := maps.Open(log, bpf.LPMSpec(pressureLPM, bpf.KeySizeV4, 1, pressureMax), dir); err != nil {
		t.Fatal(err)
	}
	if err := maps.OpenSpill(log, &ebpf.MapSpec{Name: pressureChunks, Type: ebpf.Hash, KeySize: 8, ValueSize: 8,
		MaxEntries: pressureMax, Flags: unix.BPF_F_NO_PREALLOC}, dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(maps.Close)

	db := statedb.New()
	table, err := statedb.NewTable(db, "pressure-test", pressureIndex)
	if err != nil {
		t.Fatal(err)
	}
	out := TableMetrics[*pressureEntry](db, table, maps)

	kernel := func(name string) float64 {
		keys, err := bpf.Keys(maps.Opened()[name])
		if err != nil {
			t.Fatal(err)
		}
		return float64(len(keys))
	}
	// write reconciles the entries as the reconciler does: one batch,
	// each row Done or Error by its result.
	write := func(entries []*pressureEntry) {
		batch := make([]reconciler.BatchEntry[*pressureEntry], len(entries))
		for i, e := range entries {
			batch[i].Object = e
		}
		maps.Ops().UpdateBatch(context.Background(), nil, batch)
		wtxn := db.WriteTxn(table)
		for _, b := range batch {
			e := *b.Object
			e.Status = reconciler.StatusDone()
			if b.Result != nil {
				e.Status = reconciler.StatusError(b.Result)
			}
			table.Insert(wtxn, &e)
		}
		wtxn.Commit()
	}
	check := func(step string, wantLPM, wantChunks float64) {
		t.Helper()
		got := gather(t, out.Collectors)
		for name, want := range map[string]float64{pressureLPM: wantLPM, pressureChunks: wantChunks} {
			if k := kernel(name); k != want {
				t.Fatalf("%s: the kernel holds %g keys in %s, the test wants %g", step, k, name, want)
			}
			if e := got["enimasq_bpf_map_entries"][name]; e != want {
				t.Errorf("%s: enimasq_bpf_map_entries{map=%s} = %g, want %g", step, name, e, want)
			}
			if p := got["enimasq_bpf_map_pressure"][name]; p != want/pressureMax {
				t.Errorf("%s: enimasq_bpf_map_pressure{map=%s} = %g, want %g", step, name, p, want/pressureMax)
			}
			if c := got["enimasq_bpf_map_capacity"][name]; c != pressureMax {
				t.Errorf("%s: enimasq_bpf_map_capacity{map=%s} = %g, want %d", step, name, c, pressureMax)
			}
		}
		u := Usage[*pressureEntry](db.ReadTxn(), table, maps)
		if u[pressureLPM].Entries != int(wantLPM) || u[pressureChunks].Entries != int(wantChunks) ||
			u[pressureLPM].MaxEntries != pressureMax || u[pressureLPM].Pressure() != wantLPM/pressureMax {
			t.Errorf("%s: Usage = %+v, want %g and %g entries of %d", step, u, wantLPM, wantChunks, pressureMax)
		}
	}
	entry := func(i int, chunks ...uint64) *pressureEntry {
		return &pressureEntry{Prefix: netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/16", i)), Chunks: chunks}
	}

	check("empty", 0, 0)

	// Ten entries; their chunks are shared: 0..4 for the even ones, 5 for
	// the odd ones.
	var ten []*pressureEntry
	for i := range 10 {
		if i%2 == 0 {
			ten = append(ten, entry(i, 0, 1, 2, 3, 4))
		} else {
			ten = append(ten, entry(i, 5))
		}
	}
	write(ten)
	check("ten", 10, 6)

	// Twenty into a map of 16: the kernel takes 16, four rows are in Error.
	// The ten rewritten entries take the chunks only they held (3, 4, 5)
	// with them.
	var twenty []*pressureEntry
	for i := range 20 {
		twenty = append(twenty, entry(i, uint64(i%3)))
	}
	write(twenty)
	check("full", pressureMax, 3)
	if n := table.NumObjects(db.ReadTxn()); n != 20 {
		t.Fatalf("%d rows, want 20", n)
	}

	// A chunk no entry of this run wrote (an earlier run's) is the prune's;
	// the metrics count it only once listed (after the prune: gone).
	if err := maps.Opened()[pressureChunks].Put(binary.LittleEndian.AppendUint64(nil, 9), make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	if err := maps.Ops().Prune(context.Background(), db.ReadTxn(), table.All(db.ReadTxn())); err != nil {
		t.Fatal(err)
	}
	check("pruned", pressureMax, 3)
}

// A scrape walks the table only when it changed: 300,000 rows (a node of
// 50,000 pods) cost one walk, and nothing while the table stays as it is.
func BenchmarkMapPressureScrape(b *testing.B) {
	db := statedb.New()
	table, err := statedb.NewTable(db, "pressure-bench", pressureIndex)
	if err != nil {
		b.Fatal(err)
	}
	wtxn := db.WriteTxn(table)
	for i := range 300_000 {
		addr := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		table.Insert(wtxn, &pressureEntry{Prefix: netip.PrefixFrom(addr, 32), Status: reconciler.StatusDone()})
	}
	wtxn.Commit()
	maps := NewMaps[*pressureEntry](MapsParams{Config: DefaultConfig}, "pressure-bench")
	c := newPressureCollector(db, table, maps)
	scrape := func() {
		ch := make(chan prometheus.Metric, 16)
		go func() { c.Collect(ch); close(ch) }()
		for range ch {
		}
	}
	b.Run("changed", func(b *testing.B) {
		for b.Loop() {
			c.rows = nil // as if the table changed
			scrape()
		}
	})
	b.Run("unchanged", func(b *testing.B) {
		for b.Loop() {
			scrape()
		}
	})
}
