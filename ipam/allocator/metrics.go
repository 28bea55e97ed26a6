package allocator

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/cells/metrics"
)

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

// Reasons are every value of the reason label.
var Reasons = []string{ReasonInvalidRequest, ReasonNotReady, ReasonPoolExhausted, ReasonNotInPool, ReasonIPInUse, ReasonOwnerHasIP, ReasonCheckpoint}

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
	failures *prometheus.CounterVec
}

func newIPAMMetrics() *ipamMetrics {
	m := &ipamMetrics{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Name: "ipam_allocation_failures_total",
			Help: "Pod IP allocations refused, by reason",
		}, []string{"reason"}),
	}
	// Every reason at 0 from the start: increase() sees the first refusal.
	for _, reason := range Reasons {
		m.failures.WithLabelValues(reason)
	}
	return m
}

func (m *ipamMetrics) allocationFailed(err error) {
	if m == nil {
		return
	}
	m.failures.WithLabelValues(failureReason(err)).Inc()
}

// collectors are the allocator's collectors: the failures.
func (m *ipamMetrics) collectors() metrics.Outs {
	return metrics.Outs{Collectors: []prometheus.Collector{m.failures}}
}
