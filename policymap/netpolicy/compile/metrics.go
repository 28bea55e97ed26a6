package compile

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/cells/metrics"
)

// policyMetrics are the compiler's metrics:
// enimasq_policy_compile_duration_seconds, the time to compile the pods a
// change of policy-endpoints affects and write their entries.
type policyMetrics struct {
	compile prometheus.Histogram
}

func newPolicyMetrics() *policyMetrics {
	return &policyMetrics{
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
	return metrics.Outs{Collectors: []prometheus.Collector{m.compile}}
}
