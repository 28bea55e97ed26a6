package metrics

import (
	"runtime"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
)

// Namespace prefixes every metric.
const Namespace = "enimasq"

// Group is the value group of enimasq's collectors.
const Group = "enimasq-metrics"

// Out adds a collector to the group.
type Out struct {
	cell.Out
	Collector prometheus.Collector `group:"enimasq-metrics"`
}

// Outs adds several collectors to the group.
type Outs struct {
	cell.Out
	Collectors []prometheus.Collector `group:"enimasq-metrics,flatten"`
}

// In receives the group.
type In struct {
	cell.In
	Collectors []prometheus.Collector `group:"enimasq-metrics"`
}

// Register registers every collector of the group with reg.
func Register(reg prometheus.Registerer, collectors []prometheus.Collector) error {
	for _, c := range collectors {
		if c == nil {
			continue
		}
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Reconcile statuses, as label values.
const (
	StatusPending = "pending"
	StatusDone    = "done"
	StatusError   = "error"
)

// statusLabel maps a reconciler status kind to its label value.
func statusLabel(k reconciler.StatusKind) string {
	switch k {
	case reconciler.StatusKindDone:
		return StatusDone
	case reconciler.StatusKindError:
		return StatusError
	default:
		return StatusPending
	}
}

// tableRows is enimasq_reconcile_rows{table, status}: the rows of a
// desired-state table by reconcile status, read at scrape time.
type tableRows[Obj any] struct {
	db     *statedb.DB
	table  statedb.Table[Obj]
	status func(Obj) (reconciler.Status, bool)
	desc   *prometheus.Desc
}

// TableRows collects enimasq_reconcile_rows for table. status returns an
// object's reconcile status, and false for a row that is not reconciled
// (a skipped entry), which is not counted.
func TableRows[Obj any](db *statedb.DB, table statedb.Table[Obj], status func(Obj) (reconciler.Status, bool)) prometheus.Collector {
	return &tableRows[Obj]{
		db: db, table: table, status: status,
		// table is a constant label: each table's collector is its own.
		desc: prometheus.NewDesc(Namespace+"_reconcile_rows",
			"Rows of a desired-state table by reconcile status (pending, done, error)",
			[]string{"status"}, prometheus.Labels{"table": table.Name()}),
	}
}

func (c *tableRows[Obj]) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *tableRows[Obj]) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]int{StatusPending: 0, StatusDone: 0, StatusError: 0}
	for obj := range c.table.All(c.db.ReadTxn()) {
		if st, ok := c.status(obj); ok {
			counts[statusLabel(st.Kind)]++
		}
	}
	for status, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), status)
	}
}

// Source is the health of one input (a file, or the API server) of a
// source cell: enimasq_source_errors_total{source} counts the reads that
// failed (an invalid file, an unreadable one, an API error), and
// enimasq_source_last_success_timestamp_seconds{source} is when a read last
// put a good state in force.
type Source struct {
	errors      prometheus.Counter
	lastSuccess prometheus.Gauge
}

// NewSource makes the metrics of the source named name.
func NewSource(name string) *Source {
	labels := prometheus.Labels{"source": name}
	return &Source{
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "source_errors_total", ConstLabels: labels,
			Help: "Reads of an input source that failed (the last good state stayed in force)",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "source_last_success_timestamp_seconds", ConstLabels: labels,
			Help: "When a read of an input source last put a good state in force (Unix time)",
		}),
	}
}

// Error counts a failed read. A nil *Source does nothing.
func (s *Source) Error() {
	if s != nil {
		s.errors.Inc()
	}
}

// Success records a good read now. A nil *Source does nothing.
func (s *Source) Success() {
	if s != nil {
		s.lastSuccess.SetToCurrentTime()
	}
}

func (s *Source) Describe(ch chan<- *prometheus.Desc) {
	s.errors.Describe(ch)
	s.lastSuccess.Describe(ch)
}

func (s *Source) Collect(ch chan<- prometheus.Metric) {
	s.errors.Collect(ch)
	s.lastSuccess.Collect(ch)
}

// Reconcilers are the names of enimasq's reconcilers: their counters are
// present at 0 from the start, so that increase() sees their first failure.
var Reconcilers = []string{"masq-map", "policy-map", "policy-attachments", "policy-bindings", "eni-rules", "eni-routes"}

// CheckReconcilers are the reconcilers whose prune is their periodic check
// against the kernel (every second): a check that succeeds is not counted
// as a prune (enimasq_prune_duration_seconds), a failed one is counted in
// enimasq_prune_errors_total.
var CheckReconcilers = []string{"policy-attachments", "policy-bindings"}

// Reconciler is a reconciler.Metrics on Prometheus:
// enimasq_reconcile_duration_seconds{reconciler, operation},
// enimasq_reconcile_objects_in_error{reconciler} (objects currently
// failing), enimasq_reconcile_errors_total{reconciler} (failures, counted as
// they happen), enimasq_prune_duration_seconds{reconciler} and
// enimasq_prune_errors_total{reconciler}. The reconciler label is its name
// (Reconcilers).
type Reconciler struct {
	duration      *prometheus.HistogramVec
	errors        *prometheus.GaugeVec
	errorsTotal   *prometheus.CounterVec
	pruneDuration *prometheus.HistogramVec
	pruneErrors   *prometheus.CounterVec
	checks        map[string]bool
}

var _ reconciler.Metrics = (*Reconciler)(nil)

// NewReconciler makes the reconciler metrics.
func NewReconciler() *Reconciler {
	buckets := prometheus.ExponentialBuckets(10e-6, 4, 10) // 10us .. 2.6s
	r := &Reconciler{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "reconcile_duration_seconds", Buckets: buckets,
			Help: "Duration of one reconcile operation (update, delete) of a table's object",
		}, []string{"reconciler", "operation"}),
		// Not reconcile_errors: under OpenMetrics that is also the name of
		// the counter reconcile_errors_total.
		errors: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "reconcile_objects_in_error",
			Help: "Objects of a table whose last reconcile failed (retried with backoff)",
		}, []string{"reconciler"}),
		errorsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "reconcile_errors_total",
			Help: "Reconcile failures of a table's objects",
		}, []string{"reconciler"}),
		pruneDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "prune_duration_seconds", Buckets: buckets,
			Help: "Duration of a prune (deleting what no row desires) of a table",
		}, []string{"reconciler"}),
		pruneErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "prune_errors_total",
			Help: "Prunes of a table that failed",
		}, []string{"reconciler"}),
		checks: map[string]bool{},
	}
	for _, name := range CheckReconcilers {
		r.checks[name] = true
	}
	for _, name := range Reconcilers {
		r.errors.WithLabelValues(name)
		r.errorsTotal.WithLabelValues(name)
		r.pruneErrors.WithLabelValues(name)
	}
	return r
}

func (r *Reconciler) ReconciliationDuration(_ cell.FullModuleID, name, operation string, d time.Duration) {
	r.duration.WithLabelValues(name, operation).Observe(d.Seconds())
}

func (r *Reconciler) ReconciliationErrors(_ cell.FullModuleID, name string, new, current int) {
	r.errors.WithLabelValues(name).Set(float64(current))
	r.errorsTotal.WithLabelValues(name).Add(float64(new))
}

func (r *Reconciler) PruneError(_ cell.FullModuleID, name string, err error) {
	if err != nil {
		r.pruneErrors.WithLabelValues(name).Inc()
	}
}

func (r *Reconciler) PruneDuration(_ cell.FullModuleID, name string, d time.Duration) {
	if r.checks[name] {
		return // the check of CheckReconcilers, every second: not a prune
	}
	r.pruneDuration.WithLabelValues(name).Observe(d.Seconds())
}

func (r *Reconciler) Describe(ch chan<- *prometheus.Desc) {
	r.duration.Describe(ch)
	r.errors.Describe(ch)
	r.errorsTotal.Describe(ch)
	r.pruneDuration.Describe(ch)
	r.pruneErrors.Describe(ch)
}

func (r *Reconciler) Collect(ch chan<- prometheus.Metric) {
	r.duration.Collect(ch)
	r.errors.Collect(ch)
	r.errorsTotal.Collect(ch)
	r.pruneDuration.Collect(ch)
	r.pruneErrors.Collect(ch)
}

// Version is the agent's version in enimasq_build_info; the standalone
// agent sets it before its hive is built.
var Version = "dev"

// BuildInfo is enimasq_build_info{version, go_version}, always 1, as
// Prometheus' own *_build_info.
func BuildInfo() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help:        "The agent's version and the Go version it was built with (always 1)",
		ConstLabels: prometheus.Labels{"version": Version, "go_version": runtime.Version()},
	}, func() float64 { return 1 })
}
