package source

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/cells/metrics"
)

// PolicySourceName names the PolicyEndpoints (files or API server) in the
// source metrics.
const PolicySourceName = "policy-endpoints"

// sourceMetrics are the source's metrics (metrics.Source).
type sourceMetrics struct {
	source *metrics.Source
}

func newSourceMetrics() *sourceMetrics {
	return &sourceMetrics{source: metrics.NewSource(PolicySourceName)}
}

func (m *sourceMetrics) collectors() metrics.Outs {
	return metrics.Outs{Collectors: []prometheus.Collector{m.source}}
}
