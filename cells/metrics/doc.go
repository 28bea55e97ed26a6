// Package metrics is enimasq's Prometheus instrumentation, the parts every
// feature shares: the collectors a feature cell adds to the value group
// "enimasq-metrics" (Out), rows of a reconciled table by status, the health
// of an input source, BPF map operations and pressure, and a
// reconciler.Metrics.
//
// It imports no feature and declares no registry: whoever hosts the cells
// registers the group. The standalone agent (cells/infra) serves it on
// --prometheus-serve-addr and on its API socket; a Cilium build
// (cmd/cilium-agent/ciliumlink) registers it with Cilium's registry. Every
// name starts with enimasq_; labels follow Cilium's style (lower case,
// snake_case, few values).
package metrics
