package ciliumlink

import (
	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cilium/cilium/pkg/metrics/metric"

	"github.com/enimasq/enimasq/cells/metrics"
)

// enimasqMetrics is every enimasq collector (enimasq_*) as one of Cilium's
// hive metrics (the "hive-metrics" group that Cilium's registry registers
// when it is built), so that Cilium's --prometheus-serve-addr serves them
// next to cilium_*, `--metrics=-enimasq` turns them off, and nothing is
// built before Cilium builds its registry. The reconciler metrics are
// Cilium's own there (cilium_reconciler_*, module ids enimasq.ipmasq,
// enimasq.policymap, enimasq.ipam).
type enimasqMetrics struct {
	collectors []prometheus.Collector
	enabled    bool
}

var _ metric.WithMetadata = (*enimasqMetrics)(nil)

type hiveMetricOut struct {
	cell.Out
	Metric metric.WithMetadata `group:"hive-metrics"`
}

func newEnimasqMetrics(p metrics.In) hiveMetricOut {
	return hiveMetricOut{Metric: &enimasqMetrics{collectors: p.Collectors, enabled: true}}
}

func (m *enimasqMetrics) IsEnabled() bool    { return m.enabled }
func (m *enimasqMetrics) SetEnabled(on bool) { m.enabled = on }
func (m *enimasqMetrics) Opts() metric.Opts {
	return metric.Opts{ConfigName: metrics.Namespace, Help: "enimasq's metrics (enimasq_*)"}
}

func (m *enimasqMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors {
		c.Describe(ch)
	}
}

func (m *enimasqMetrics) Collect(ch chan<- prometheus.Metric) {
	if !m.enabled {
		return
	}
	for _, c := range m.collectors {
		c.Collect(ch)
	}
}
