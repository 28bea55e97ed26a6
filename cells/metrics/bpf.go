package metrics

import (
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a map operation, as label values.
const (
	OutcomeSuccess = "success"
	OutcomeFail    = "fail"
)

// MapOps is enimasq_bpf_map_ops_total{map, operation, outcome}, as Cilium's
// cilium_bpf_map_ops_total: one count per entry operation the reconciler
// made (batched or not), and per prune (map "").
type MapOps struct {
	ops  *prometheus.CounterVec
	maps func() map[string]uint32 // the open maps, whose series start at 0
}

// Seed makes every series of the maps that maps returns (the open ones)
// present at 0 from the first scrape on, and those of the prune: a first
// failure is then an increase.
func (m *MapOps) Seed(maps func() map[string]uint32) { m.maps = maps }

func (m *MapOps) seed() {
	for _, outcome := range []string{OutcomeSuccess, OutcomeFail} {
		m.ops.WithLabelValues("", "prune", outcome)
		if m.maps == nil {
			continue
		}
		for name := range m.maps() {
			for _, op := range []string{"update", "delete"} {
				m.ops.WithLabelValues(name, op, outcome)
			}
		}
	}
}

// NewMapOps makes the counter; table names the reconciled table (a const
// label), so that each table's operations are their own series.
func NewMapOps(table string) *MapOps {
	return &MapOps{ops: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "bpf_map_ops_total",
		Help:        "BPF map operations by map, operation (update, delete, prune) and outcome (success, fail)",
		ConstLabels: prometheus.Labels{"table": table},
	}, []string{"map", "operation", "outcome"})}
}

// Observe counts one operation (a bpf.OpObserver).
func (m *MapOps) Observe(mapName, op string, err error) {
	outcome := OutcomeSuccess
	if err != nil {
		outcome = OutcomeFail
	}
	m.ops.WithLabelValues(mapName, op, outcome).Inc()
}

func (m *MapOps) Describe(ch chan<- *prometheus.Desc) { m.ops.Describe(ch) }
func (m *MapOps) Collect(ch chan<- prometheus.Metric) {
	m.seed()
	m.ops.Collect(ch)
}

// mapPressure is enimasq_bpf_map_pressure{map}: the entries of a map that
// the table holds in the kernel (rows Done) over its max entries, as
// Cilium's cilium_bpf_map_pressure. Computed at scrape time from the table,
// not by walking the map (5 us a key).
type mapPressure[Obj any] struct {
	db      *statedb.DB
	table   statedb.Table[Obj]
	entry   func(Obj) (mapName string, st reconciler.Status, ok bool)
	maxOf   func() map[string]uint32 // max entries of the open maps
	desc    *prometheus.Desc
	entries *prometheus.Desc
}

// MapPressure collects enimasq_bpf_map_pressure{map} and
// enimasq_bpf_map_entries{map} for the maps of table. entry returns an
// object's map and status (ok false: not programmed); maxOf returns the open
// maps and their max entries.
func MapPressure[Obj any](db *statedb.DB, table statedb.Table[Obj],
	entry func(Obj) (string, reconciler.Status, bool), maxOf func() map[string]uint32,
) prometheus.Collector {
	return &mapPressure[Obj]{
		db: db, table: table, entry: entry, maxOf: maxOf,
		desc: prometheus.NewDesc(Namespace+"_bpf_map_pressure",
			"Entries of a BPF map over its max entries (0 to 1)", []string{"map"}, prometheus.Labels{"table": table.Name()}),
		entries: prometheus.NewDesc(Namespace+"_bpf_map_entries",
			"Entries of a BPF map that are in the kernel (rows Done)", []string{"map"}, prometheus.Labels{"table": table.Name()}),
	}
}

func (c *mapPressure[Obj]) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.entries
}

func (c *mapPressure[Obj]) Collect(ch chan<- prometheus.Metric) {
	maxOf := c.maxOf()
	counts := make(map[string]int, len(maxOf))
	for name := range maxOf {
		counts[name] = 0
	}
	for obj := range c.table.All(c.db.ReadTxn()) {
		if name, st, ok := c.entry(obj); ok && st.Kind == reconciler.StatusKindDone {
			if _, open := counts[name]; open {
				counts[name]++
			}
		}
	}
	for name, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(n), name)
		if max := maxOf[name]; max > 0 {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n)/float64(max), name)
		}
	}
}
