package policymap

import (
	"sync"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/metrics"
)

// MapUsage is how full one open map is: the entries the kernel holds and
// its max entries.
type MapUsage struct {
	Entries    int
	MaxEntries uint32
}

// Pressure is Entries over MaxEntries (0 to 1), as Cilium's
// cilium_bpf_map_pressure.
func (u MapUsage) Pressure() float64 {
	if u.MaxEntries == 0 {
		return 0
	}
	return float64(u.Entries) / float64(u.MaxEntries)
}

// Usage returns the usage of every open map of a table's Maps, without a
// syscall. An LPM map's entries are the table's rows of that map in Done: a
// row is Done only while the kernel holds its key (a row written and not
// yet Done again, or deleted and not yet gone, is the difference). A spill
// (chunk) map's entries are the distinct chunks the operations hold
// ([bpf.Ops.SpillEntries]): chunks are shared, so rows cannot count them.
func Usage[E interface {
	bpf.Entry
	GetStatus() reconciler.Status
}](txn statedb.ReadTxn, table statedb.Table[E], ops *Maps[E]) map[string]MapUsage {
	return usage(txn, table, ops, nil)
}

// usage is Usage; rows, when not nil, are the LPM maps' Done rows already
// counted.
func usage[E interface {
	bpf.Entry
	GetStatus() reconciler.Status
}](txn statedb.ReadTxn, table statedb.Table[E], ops *Maps[E], rows map[string]int) map[string]MapUsage {
	if rows == nil {
		rows = doneRows(txn, table)
	}
	out := map[string]MapUsage{}
	for name, max := range ops.maxEntries() {
		n, spill := ops.inner.SpillEntries(name)
		if !spill {
			n = rows[name]
		}
		out[name] = MapUsage{Entries: n, MaxEntries: max}
	}
	return out
}

// doneRows counts the rows in Done by map.
func doneRows[E interface {
	bpf.Entry
	GetStatus() reconciler.Status
}](txn statedb.ReadTxn, table statedb.Table[E]) map[string]int {
	rows := map[string]int{}
	for e := range table.All(txn) {
		if name := e.MapName(); name != "" && e.GetStatus().Kind == reconciler.StatusKindDone {
			rows[name]++
		}
	}
	return rows
}

// pressureCollector collects, for every open map of a table,
// enimasq_bpf_map_entries, enimasq_bpf_map_pressure and
// enimasq_bpf_map_capacity, labelled table and map. It walks the table only
// when it changed since the last scrape, and never the kernel's maps.
type pressureCollector[E interface {
	bpf.Entry
	GetStatus() reconciler.Status
}] struct {
	db    *statedb.DB
	table statedb.Table[E]
	ops   *Maps[E]

	entries, pressure, capacity *prometheus.Desc

	mu   sync.Mutex
	rev  statedb.Revision // of the table when rows were counted
	rows map[string]int   // Done rows by map, at rev
}

func newPressureCollector[E interface {
	bpf.Entry
	GetStatus() reconciler.Status
}](db *statedb.DB, table statedb.Table[E], ops *Maps[E]) *pressureCollector[E] {
	labels := prometheus.Labels{"table": table.Name()}
	return &pressureCollector[E]{
		db: db, table: table, ops: ops,
		entries: prometheus.NewDesc(metrics.Namespace+"_bpf_map_entries",
			"Entries of a BPF map that are in the kernel (LPM maps: rows Done; chunk maps: distinct chunks written and not pruned)",
			[]string{"map"}, labels),
		pressure: prometheus.NewDesc(metrics.Namespace+"_bpf_map_pressure",
			"Entries of a BPF map over its max entries (0 to 1), as cilium_bpf_map_pressure", []string{"map"}, labels),
		capacity: prometheus.NewDesc(metrics.Namespace+"_bpf_map_capacity",
			"Max entries of a BPF map", []string{"map"}, labels),
	}
}

func (c *pressureCollector[E]) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.entries
	ch <- c.pressure
	ch <- c.capacity
}

func (c *pressureCollector[E]) Collect(ch chan<- prometheus.Metric) {
	txn := c.db.ReadTxn()
	c.mu.Lock()
	if rev := c.table.Revision(txn); c.rows == nil || rev != c.rev {
		c.rows, c.rev = doneRows(txn, c.table), rev
	}
	rows := c.rows
	c.mu.Unlock()
	for name, u := range usage(txn, c.table, c.ops, rows) {
		ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(u.Entries), name)
		ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(u.MaxEntries), name)
		if u.MaxEntries > 0 {
			ch <- prometheus.MustNewConstMetric(c.pressure, prometheus.GaugeValue, u.Pressure(), name)
		}
	}
}
