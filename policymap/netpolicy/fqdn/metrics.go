package fqdn

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/cells/dnsproxy"
	"github.com/enimasq/enimasq/cells/metrics"
)

// fqdnMetrics are the domain names' metrics: lookups seen, answers
// applied, addresses held and dropped, and the time from an answer to the
// kernel; the proxy's own counters are read when scraped.
type fqdnMetrics struct {
	lookups  prometheus.Counter
	answers  prometheus.Counter
	drops    prometheus.Counter
	latency  *prometheus.HistogramVec
	held     prometheus.GaugeFunc
	failures []prometheus.Collector
}

func newFQDNMetrics(held func() float64, stats func() dnsproxy.Stats) *fqdnMetrics {
	m := &fqdnMetrics{
		lookups: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Name: "policy_fqdn_lookups_total",
			Help: "DNS answers the proxy got for the pods that domain-name rules select",
		}),
		answers: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Name: "policy_fqdn_answers_applied_total",
			Help: "Names answered that a domain-name rule matched, written to policy-fqdn",
		}),
		drops: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Name: "policy_fqdn_ips_dropped_total",
			Help: "Addresses dropped past --tofqdns-endpoint-max-ip-per-hostname or --tofqdns-max-names-per-pod (the first to expire go)",
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metrics.Namespace, Name: "policy_fqdn_answer_to_kernel_seconds",
			Help:    "Time from an answer with new addresses to their being in the kernel (outcome=applied), or to giving up (outcome=timeout: the pod got SERVFAIL)",
			Buckets: prometheus.ExponentialBuckets(50e-6, 4, 10),
		}, []string{"outcome"}),
		held: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: metrics.Namespace, Name: "policy_fqdn_ips",
			Help: "Addresses held in policy-fqdn (pod, name, address)",
		}, held),
	}
	for _, r := range []dnsproxy.Reason{dnsproxy.ReasonOverload, dnsproxy.ReasonUpstream, dnsproxy.ReasonAnswer, dnsproxy.ReasonHook} {
		m.failures = append(m.failures, failureCounter("servfail", r, func() uint64 { return stats().ServFail[r] }))
	}
	for _, r := range []dnsproxy.Reason{dnsproxy.ReasonMalformed, dnsproxy.ReasonOversize, dnsproxy.ReasonOrigDst, dnsproxy.ReasonConnLimit, dnsproxy.ReasonSend} {
		m.failures = append(m.failures, failureCounter("dropped", r, func() uint64 { return stats().Dropped[r] }))
	}
	return m
}

// failureCounter reads one of the proxy's counters when scraped.
func failureCounter(outcome string, r dnsproxy.Reason, n func() uint64) prometheus.CounterFunc {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: metrics.Namespace, Name: "policy_fqdn_proxy_failures_total",
		Help:        "Lookups the DNS proxy failed: answered SERVFAIL (outcome=servfail) or not at all (outcome=dropped), by reason",
		ConstLabels: prometheus.Labels{"outcome": outcome, "reason": string(r)},
	}, func() float64 { return float64(n()) })
}

func (m *fqdnMetrics) lookup()       { m.lookups.Inc() }
func (m *fqdnMetrics) applied(n int) { m.answers.Add(float64(n)) }
func (m *fqdnMetrics) dropped(n int) { m.drops.Add(float64(n)) }

func (m *fqdnMetrics) toKernel(d time.Duration, ok bool) {
	outcome := "applied"
	if !ok {
		outcome = "timeout"
	}
	m.latency.WithLabelValues(outcome).Observe(d.Seconds())
}

func (m *fqdnMetrics) collectors() metrics.Outs {
	return metrics.Outs{Collectors: append([]prometheus.Collector{m.lookups, m.answers, m.drops, m.latency, m.held}, m.failures...)}
}
