package enforce

import (
	"strconv"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/metrics"
)

// verdictCounters is enimasq_policy_verdicts_total{direction, verdict,
// tier}: the decisions of the policy programs on the pods' devices, read
// at scrape from their per-CPU counters (policybpf.PolicyVerdictsMapName, pinned
// with the programs' state: they go on across restarts of the agent). All
// 24 series are there from the first scrape on, at 0 until a packet
// counts. verdict="audit" counts the packets the policy denied and audit
// mode (--policy-audit-mode) passed. Not counted: the packets of a connection already allowed, ARP,
// neighbour discovery, and the drops before the policy (spoofed, malformed,
// unknown fragments).
type verdictCounters struct {
	desc *prometheus.Desc
	on   bool // enforcement runs
	// info is enimasq_policy_enforcement_info{mode, audit}: 1, the mode
	// the programs run in (enimasq-dbg status shows it).
	info prometheus.Collector

	mu sync.Mutex
	// read returns the counters (policybpf.ReadPolicyVerdicts of the state
	// map); nil until the programs' state is there.
	read func() ([policybpf.PolicyVerdictCounters]uint64, error)
}

func newVerdictCounters(s Settings) *verdictCounters {
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: metrics.Namespace + "_policy_enforcement_info",
		Help: "The mode of the network-policy programs: mode (standard, strict) and audit (true: a packet the policy denies passes, --policy-audit-mode); always 1",
		ConstLabels: prometheus.Labels{
			"mode":  s.Mode.String(),
			"audit": strconv.FormatBool(s.Audit),
		},
	})
	info.Set(1)
	return &verdictCounters{
		info: info,
		on:   s.Off == "",
		desc: prometheus.NewDesc(metrics.Namespace+"_policy_verdicts_total",
			"Decisions of the network-policy programs on the pods' devices by direction (ingress, egress), verdict (allow, deny, "+
				"audit: denied by the policy and passed by --policy-audit-mode) "+
				"and the tier that decided (admin, namespace, baseline, default); packets of an allowed connection and drops before the policy are not counted",
			[]string{"direction", "verdict", "tier"}, nil),
	}
}

// collectors puts the counters in the metrics group while enforcement
// runs: with it off, no program counts.
func (c *verdictCounters) collectors() metrics.Outs {
	if !c.on {
		return metrics.Outs{}
	}
	return metrics.Outs{Collectors: []prometheus.Collector{c, c.info}}
}

// readFrom reads the counters from the programs' state map.
func (c *verdictCounters) readFrom(state func(name string) (*ebpf.Map, error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read = func() ([policybpf.PolicyVerdictCounters]uint64, error) {
		m, err := state(policybpf.PolicyVerdictsMapName)
		if err != nil {
			return [policybpf.PolicyVerdictCounters]uint64{}, err
		}
		return policybpf.ReadPolicyVerdicts(m)
	}
}

func (c *verdictCounters) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect sends the 24 series; none while the counters cannot be read
// (the state maps not open yet): a counter at 0 would be a reset.
func (c *verdictCounters) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	read := c.read
	c.mu.Unlock()
	if read == nil {
		return
	}
	counts, err := read()
	if err != nil {
		return
	}
	for i, n := range counts {
		egress, verdict, step := policybpf.VerdictCounterOf(uint32(i))
		direction := policybpf.Ingress.String()
		if egress {
			direction = policybpf.Egress.String()
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), direction, verdict.String(), step.String())
	}
}

// observers read what the programs observe: the verdict counters (the
// metrics) and, with Settings.Events, the denied packets (Events, served
// on EventsPath).
type observers struct {
	events   *Events
	counters *verdictCounters
}

type observersOut struct {
	cell.Out

	Observers *observers
	Metrics   metrics.Outs
}

func newObservers(p eventsParams) observersOut {
	o := &observers{events: newEvents(p), counters: newVerdictCounters(p.Settings)}
	return observersOut{Observers: o, Metrics: o.counters.collectors()}
}

// start points them at the programs' state maps, once enforcement runs.
func (o *observers) start(jobs job.Group, progs *programs) {
	o.counters.readFrom(progs.stateMap)
	o.events.start(jobs, progs.stateMap)
}
