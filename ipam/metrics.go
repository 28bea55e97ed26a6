package ipam

import (
	"errors"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/cells/metrics"
)

// SourceName names the CiliumNode (file or API server) in the source metrics.
const SourceName = "ciliumnode"

// Allocation failure reasons (enimasq_ipam_allocation_failures_total).
const (
	ReasonInvalidRequest = "invalid-request"
	ReasonNotReady       = "not-ready"
	ReasonPoolExhausted  = "pool-exhausted"
	ReasonNotInPool      = "not-in-pool"
	ReasonIPInUse        = "ip-in-use"
	ReasonOwnerHasIP     = "owner-has-ip"
	ReasonCheckpoint     = "checkpoint"
)

// failureReason classifies an allocation error for the metric.
func failureReason(err error) string {
	for _, r := range []struct {
		err    error
		reason string
	}{
		{ErrInvalidRequest, ReasonInvalidRequest},
		{ErrNotReady, ReasonNotReady},
		{ErrPoolExhausted, ReasonPoolExhausted},
		{ErrNotInPool, ReasonNotInPool},
		{ErrIPInUse, ReasonIPInUse},
		{ErrOwnerHasIP, ReasonOwnerHasIP},
	} {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	// The only other failure is writing the checkpoint.
	return ReasonCheckpoint
}

// ipamMetrics are the ENI IPAM's own metrics.
type ipamMetrics struct {
	source   *metrics.Source
	failures *prometheus.CounterVec
}

func newIPAMMetrics() *ipamMetrics {
	return &ipamMetrics{
		source: metrics.NewSource(SourceName),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Name: "ipam_allocation_failures_total",
			Help: "Pod IP allocations refused, by reason",
		}, []string{"reason"}),
	}
}

func (m *ipamMetrics) allocationFailed(err error) {
	if m == nil {
		return
	}
	m.failures.WithLabelValues(failureReason(err)).Inc()
}

// poolIPs is enimasq_ipam_ips{eni, type}: per usable ENI, the IPs of its
// pool, those used (allocated) and those available, at scrape time.
type poolIPs struct {
	db     *statedb.DB
	enis   statedb.Table[*ENI]
	allocs statedb.Table[*Allocation]
	desc   *prometheus.Desc
}

func (c *poolIPs) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *poolIPs) Collect(ch chan<- prometheus.Metric) {
	txn := c.db.ReadTxn()
	used := map[string]int{}
	for a := range c.allocs.All(txn) {
		if a.ENI != "" && a.State == StateAllocated {
			used[a.ENI]++
		}
	}
	for e := range c.enis.All(txn) {
		if !e.Usable() {
			continue
		}
		pool, u := len(e.Pool), used[e.ID]
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(pool), e.ID, "pool")
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(u), e.ID, "used")
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(max(pool-u, 0)), e.ID, "available")
	}
}

// collectors are the ENI IPAM's collectors: the source, the failures, the
// pool, and the rules and routes it owns (eni-rules, eni-routes by status).
func (m *ipamMetrics) collectors(db *statedb.DB, enis statedb.Table[*ENI], allocs statedb.Table[*Allocation],
	rules statedb.Table[*Rule], routes statedb.Table[*Route],
) metrics.Outs {
	return metrics.Outs{Collectors: []prometheus.Collector{
		m.source,
		m.failures,
		&poolIPs{db: db, enis: enis, allocs: allocs, desc: prometheus.NewDesc(metrics.Namespace+"_ipam_ips",
			"IPs of a usable ENI's pool by type: pool, used (allocated), available", []string{"eni", "type"}, nil)},
		metrics.TableRows(db, rules, func(r *Rule) (reconciler.Status, bool) { return r.Status, true }),
		metrics.TableRows(db, routes, func(r *Route) (reconciler.Status, bool) { return r.Status, true }),
	}}
}
