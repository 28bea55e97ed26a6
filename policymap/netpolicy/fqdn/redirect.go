package fqdn

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/dnsproxy"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// redirected returns the pod IPs whose lookups go to the proxy: the pods
// that a name rule selects, i.e. those listed by any slice of a policy
// one of whose slices has name rules (a PolicyEndpoint's only if it
// isolates egress), sorted.
func (l *learner) redirected(txn statedb.ReadTxn) []netip.Addr {
	set := map[netip.Addr]struct{}{}
	add := func(pods []endpoints.PodEndpoint) {
		for _, p := range pods {
			set[p.PodIP] = struct{}{}
		}
	}
	seen := map[string]bool{}
	for pe := range l.pes.All(txn) {
		if len(pe.EgressNames) == 0 || !pe.IsolatesEgress {
			continue
		}
		if parent := pe.Parent(); parent != "" {
			if !seen[parent] {
				seen[parent] = true
				for s := range l.pes.List(txn, endpoints.PolicyEndpointParentIndex.Query(parent)) {
					add(s.Pods)
				}
			}
			continue
		}
		add(pe.Pods)
	}
	clear(seen)
	for c := range l.cpes.All(txn) {
		if len(c.EgressNames) == 0 {
			continue
		}
		if parent := c.Parent(); parent != "" {
			if !seen[parent] {
				seen[parent] = true
				for s := range l.cpes.List(txn, endpoints.ClusterPolicyEndpointParentIndex.Query(parent)) {
					add(s.Pods)
				}
			}
			continue
		}
		add(c.Pods)
	}
	out := make([]netip.Addr, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// redirectCheck is how often the redirect is checked against the kernel:
// iptables sends no notification of a rule flushed by hand.
const redirectCheck = 5 * time.Second

// forgetPodsBut deletes the rows of the pods no name rule selects any
// longer: what they were told allows nothing now, and a pod selected
// again learns afresh.
func (l *learner) forgetPodsBut(pods []netip.Addr) {
	wtxn := l.db.WriteTxn(l.names)
	defer wtxn.Commit()
	for row := range l.names.All(wtxn) {
		if _, found := slices.BinarySearchFunc(pods, row.Pod, netip.Addr.Compare); !found {
			l.names.Delete(wtxn, row)
			l.forget(row.Key())
		}
	}
}

// redirect keeps the redirect's pods those that name rules select, until
// ctx is done; then it takes the redirect away (a stopped agent leaves
// no lookup going to a proxy that is not there: without the redirect the
// pods' lookups go to their resolvers, and the names teach nothing, so
// nothing is allowed that was not).
func (l *learner) redirect(ctx context.Context, h cell.Health, port uint16) error {
	r := dnsproxy.NewRedirect(port, l.settings.Mark, l.settings.Table, l.log)
	defer func() {
		if err := r.Close(); err != nil {
			l.log.Warn("Could not remove the DNS redirect", "error", err)
		}
	}()
	var last, kept []netip.Addr
	synced, cleaned := false, false
	check := time.NewTicker(redirectCheck)
	defer check.Stop()
	for {
		txn := l.db.ReadTxn()
		_, pw := l.pes.AllWatch(txn)
		_, cw := l.cpes.AllWatch(txn)
		pods := l.redirected(txn)
		var retry <-chan time.Time
		// Rows of pods no rule selects go, once the objects are read
		// (before, every restored row would).
		peOK, peInit := l.pes.Initialized(txn)
		cpeOK, cpeInit := l.cpes.Initialized(txn)
		if !peOK {
			cw = peInit
		} else if !cpeOK {
			cw = cpeInit
		} else if !cleaned || !slices.Equal(pods, kept) {
			l.forgetPodsBut(pods)
			kept, cleaned = pods, true
		}
		if !synced || !slices.Equal(pods, last) {
			if err := r.Sync(pods); err != nil {
				h.Degraded("DNS redirect", fmt.Errorf("redirect the lookups of %d pods to the DNS proxy: %w", len(pods), err))
				synced, retry = false, time.After(time.Second)
			} else {
				h.OK(fmt.Sprintf("Lookups of %d pods redirected to the DNS proxy", len(pods)))
				last, synced = pods, true
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-pw:
		case <-cw:
		case <-retry:
		case <-check.C:
			// The rules, rule and route are checked against the kernel
			// (rewritten if someone removed them; nothing written if
			// they are in place).
			synced = false
		}
	}
}
