package source

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/cells/metrics"
)

// PolicySourceName names the PolicyEndpoints (files or API server) in the
// source metrics.
const PolicySourceName = "policy-endpoints"

// ClusterSourceName names the ClusterPolicyEndpoints (files or API server)
// in the source metrics.
const ClusterSourceName = "cluster-policy-endpoints"

// sourceMetrics are the source's metrics (metrics.Source), one per table.
type sourceMetrics struct {
	source, cluster *metrics.Source
	// unknown is enimasq_policy_unknown_fields_total (unknown.go).
	unknown *prometheus.CounterVec
}

func newSourceMetrics() *sourceMetrics {
	return &sourceMetrics{source: metrics.NewSource(PolicySourceName), cluster: metrics.NewSource(ClusterSourceName),
		unknown: newUnknownFieldsCounter()}
}

func (m *sourceMetrics) collectors() metrics.Outs {
	return metrics.Outs{Collectors: []prometheus.Collector{m.source, m.cluster, m.unknown}}
}
