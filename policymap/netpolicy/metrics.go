package netpolicy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/cells/metrics"
)

// PolicySourceName names the PolicyEndpoints (files or API server) in the
// source metrics.
const PolicySourceName = "policy-endpoints"

// policyMetrics are the network-policy metrics: the source's, and
// enimasq_policy_compile_duration_seconds, the time to compile the pods a
// change of policy-endpoints affects and write their entries.
type policyMetrics struct {
	source  *metrics.Source
	compile prometheus.Histogram
}

func newPolicyMetrics() *policyMetrics {
	return &policyMetrics{
		source: metrics.NewSource(PolicySourceName),
		compile: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metrics.Namespace, Name: "policy_compile_duration_seconds",
			Help:    "Time to compile the pods a change of policy-endpoints affects and write their map entries",
			Buckets: prometheus.ExponentialBuckets(50e-6, 4, 10), // 50us .. 13s
		}),
	}
}

func (m *policyMetrics) compiled(d time.Duration) {
	if m != nil {
		m.compile.Observe(d.Seconds())
	}
}

func (m *policyMetrics) collectors() metrics.Outs {
	return metrics.Outs{Collectors: []prometheus.Collector{m.source, m.compile}}
}
