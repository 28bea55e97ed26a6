package fqdn

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/dnsproxy"
	"github.com/enimasq/enimasq/cells/metrics"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// Cell redirects the lookups of the pods that name rules select to the
// DNS proxy and writes what their answers teach to policy-fqdn (the
// package comment). It takes Settings, Applied, the objects' tables and
// policy-fqdn.
var Cell = cell.Group(
	cell.ProvidePrivate(newLearner),
	cell.Provide((*learner).metricsOut),
	cell.Invoke(register),
)

type params struct {
	cell.In

	Log      *slog.Logger
	DB       *statedb.DB
	Settings Settings
	Applied  Applied
	PEs      statedb.Table[*endpoints.PolicyEndpoint]
	CPEs     statedb.Table[*endpoints.ClusterPolicyEndpoint]
	Names    statedb.RWTable[*endpoints.DNSName]
	Jobs     job.Group
	Health   cell.Health
}

// learner is the part's state: what the proxy's hook (learn.go), the
// expiry (expire.go) and the redirect (redirect.go) share.
type learner struct {
	log      *slog.Logger
	db       *statedb.DB
	settings Settings
	applied  Applied
	pes      statedb.Table[*endpoints.PolicyEndpoint]
	cpes     statedb.Table[*endpoints.ClusterPolicyEndpoint]
	names    statedb.RWTable[*endpoints.DNSName]
	metrics  *fqdnMetrics
	now      func() time.Time

	mu sync.Mutex
	// learnt is, per row key, the revision of policy-fqdn at which its
	// addresses last grew: an answer that repeats them waits for that
	// revision (an earlier lookup may still be on its way to the
	// kernel).
	learnt map[string]statedb.Revision
	// late are the pods whose last answer with new addresses did not
	// reach the kernel in time (health).
	late map[string]time.Time
	// journalMu guards journalFile (checkpoint.go) and orders its appends
	// with the snapshots.
	journalMu   sync.Mutex
	journalFile *os.File
	proxy       *dnsproxy.Proxy
	// failed is when the proxy last failed lookups, and why (health).
	failedAt  time.Time
	failedWhy string
	lastStats dnsproxy.Stats
}

func newLearner(p params) *learner {
	l := &learner{
		log: p.Log, db: p.DB, settings: p.Settings, applied: p.Applied,
		pes: p.PEs, cpes: p.CPEs, names: p.Names, now: time.Now,
		learnt: map[string]statedb.Revision{}, late: map[string]time.Time{},
	}
	l.metrics = newFQDNMetrics(l.heldIPs, l.proxyStats)
	return l
}

// metricsOut serves the metrics while names are enforced.
func (l *learner) metricsOut() metrics.Outs {
	if l.settings.Off != "" {
		return metrics.Outs{}
	}
	return l.metrics.collectors()
}

func register(p params, l *learner) error {
	wtxn := p.DB.WriteTxn(p.Names)
	defer wtxn.Commit()
	done := p.Names.RegisterInitializer(wtxn, "fqdn")
	defer done(wtxn)
	if p.Settings.Off != "" {
		p.Health.OK("Off: " + p.Settings.Off)
		return nil
	}
	// What the pods were told before a restart, before anything compiles
	// (checkpoint.go).
	dir := p.Settings.StateDir
	n, err := l.restore(wtxn, dir)
	if err != nil {
		l.log.Warn("Could not read all the names the pods were told before: they ask again", "dir", dir, "error", err)
	}
	if n > 0 {
		l.log.Info("Restored the names the pods were told", "dir", dir, "rows", n)
	}
	if err := l.openJournal(dir); err != nil {
		return fmt.Errorf("domain names: journal: %w", err)
	}
	p.Jobs.Add(job.OneShot("fqdn-checkpoint", l.writeCheckpoints(dir)))
	p.Jobs.Add(job.OneShot("fqdn-proxy", l.serve))
	p.Jobs.Add(job.OneShot("fqdn-expire", l.expire))
	p.Jobs.Add(job.OneShot("fqdn-health", func(ctx context.Context, h cell.Health) error {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			l.reportHealth(h)
			select {
			case <-t.C:
			case <-ctx.Done():
				return nil
			}
		}
	}))
	return nil
}

// openRetry is how long the proxy waits before it tries its sockets
// again.
const openRetry = 5 * time.Second

// serve opens the proxy's sockets, redirects the selected pods' lookups to
// them and serves them until ctx is done. Sockets that cannot be opened
// (a capability missing, the port taken) leave the agent running, Degraded
// with the reason, and are tried again: meanwhile no lookup is redirected,
// and name rules allow nothing new (fail closed).
func (l *learner) serve(ctx context.Context, h cell.Health) error {
	var px *dnsproxy.Proxy
	for {
		var err error
		if px, err = l.openProxy(); err == nil {
			break
		}
		h.Degraded("DNS proxy", fmt.Errorf("domain names are not enforced: %w (tried again in %s)", err, openRetry))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(openRetry):
		}
	}
	ran := make(chan error, 1)
	go func() { ran <- px.Run(ctx) }()
	l.redirect(ctx, h, px.Port())
	return <-ran
}

// openProxy opens the proxy's sockets (in the agent's network namespace).
func (l *learner) openProxy() (*dnsproxy.Proxy, error) {
	px, err := dnsproxy.New(dnsproxy.Config{
		Port: l.settings.Port, IPv4: l.settings.IPv4, IPv6: l.settings.IPv6,
		Mark: l.settings.Mark,
		// The hook may hold an answer MaxDelay: its timeout is longer.
		Timeout: max(dnsproxy.DefaultTimeout, l.settings.MaxDelay+time.Second),
	}, l.learn, l.log)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.proxy = px
	l.mu.Unlock()
	return px, nil
}

func (l *learner) proxyStats() dnsproxy.Stats {
	l.mu.Lock()
	px := l.proxy
	l.mu.Unlock()
	if px == nil {
		return dnsproxy.Stats{}
	}
	return px.Stats()
}

// heldIPs counts the addresses in policy-fqdn.
func (l *learner) heldIPs() float64 {
	n := 0
	for row := range l.names.All(l.db.ReadTxn()) {
		n += len(row.IPs)
	}
	return float64(n)
}

// learntAt records that a row's addresses grew at rev; changedAt returns
// the last such revision, or fallback if none is known.
func (l *learner) learntAt(key string, rev statedb.Revision) {
	l.mu.Lock()
	l.learnt[key] = rev
	l.mu.Unlock()
}

func (l *learner) changedAt(key string, fallback statedb.Revision) statedb.Revision {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r, ok := l.learnt[key]; ok {
		return r
	}
	return fallback
}

func (l *learner) forget(key string) {
	l.mu.Lock()
	delete(l.learnt, key)
	l.mu.Unlock()
}

// lateFor is how long a pod's late answer keeps health Degraded.
const lateFor = time.Minute

func (l *learner) reportLate(pod fmt.Stringer) {
	l.mu.Lock()
	l.late[pod.String()] = l.now()
	l.mu.Unlock()
}

// reportHealth is Degraded while an answer failed to reach the kernel in
// the last minute, or the proxy failed lookups (SERVFAIL or no answer) in
// the last minute, with the reasons.
func (l *learner) reportHealth(h cell.Health) {
	stats := l.proxyStats()
	l.mu.Lock()
	if why := failuresSince(l.lastStats, stats); why != "" {
		l.failedAt, l.failedWhy = l.now(), why
	}
	l.lastStats = stats
	failed := ""
	if !l.failedAt.IsZero() && l.now().Sub(l.failedAt) <= lateFor {
		failed = l.failedWhy
	}
	var pods []string
	for pod, at := range l.late {
		if l.now().Sub(at) > lateFor {
			delete(l.late, pod)
			continue
		}
		pods = append(pods, pod)
	}
	l.mu.Unlock()
	slices.Sort(pods)
	switch {
	case len(pods) > 0:
		h.Degraded("Answers held past the max delay", fmt.Errorf("the addresses of answers to pods %v did not reach the kernel within %s: their lookups got SERVFAIL", pods, l.settings.MaxDelay))
	case failed != "":
		h.Degraded("DNS proxy failed lookups", fmt.Errorf("the DNS proxy failed lookups of the pods it serves in the last minute (%s): they got SERVFAIL or no answer", failed))
	default:
		h.OK("Answers applied")
	}
}

// failuresSince says which of the proxy's failures grew from before to
// now: "upstream 2, malformed 1"; "" if none.
func failuresSince(before, now dnsproxy.Stats) string {
	var out []string
	for _, m := range []struct{ before, now map[dnsproxy.Reason]uint64 }{{before.ServFail, now.ServFail}, {before.Dropped, now.Dropped}} {
		for _, r := range slices.Sorted(maps.Keys(m.now)) {
			if d := m.now[r] - m.before[r]; d > 0 {
				out = append(out, fmt.Sprintf("%s %d", r, d))
			}
		}
	}
	return strings.Join(out, ", ")
}
