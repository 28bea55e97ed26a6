package fqdn

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/dnsproxy"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// What an answer teaches: for each name the pod asked that a name rule
// selecting it matches, the addresses the answer gives, written to
// policy-fqdn; then the answer waits until the kernel holds them
// (Applied), so the pod never connects to an address its policy does not
// have yet.

// matched is a name rule that selects a pod, with where it comes from.
type matched struct {
	tier policybpf.PolicyTier
	rule endpoints.NameRule
	// from names the rule: "PolicyEndpoint ns/name *.example.com".
	from string
}

// rulesOf returns the name rules that select a pod (the rules of every
// slice of the policies of the objects that list it, as the compiler
// takes them) and the pod's name ("namespace/name") from its entry.
func (l *learner) rulesOf(txn statedb.ReadTxn, pod netip.Addr) ([]matched, string) {
	var out []matched
	podName := ""
	collect := func(tier policybpf.PolicyTier, kind string, listing []endpoints.Object, slices func(string) []endpoints.Object, rules func(endpoints.Object) []endpoints.NameRule) {
		seen := map[string]bool{}
		var objs []endpoints.Object
		for _, o := range listing {
			if e, ok := o.PodEntry(pod); ok && podName == "" {
				podName = e.Namespace + "/" + e.Name
			}
			if p := o.Parent(); p != "" {
				if !seen[p] {
					seen[p] = true
					objs = append(objs, slices(p)...)
				}
				continue
			}
			objs = append(objs, o)
		}
		for _, o := range objs {
			for _, r := range rules(o) {
				out = append(out, matched{tier: tier, rule: r, from: kind + " " + o.Key() + " " + r.Pattern})
			}
		}
	}
	pes := statedb.Collect(l.pes.List(txn, endpoints.PolicyEndpointPodIndex.Query(pod)))
	collect(policybpf.TierNetworkPolicy, "PolicyEndpoint", asObjects(pes), func(parent string) []endpoints.Object {
		return asObjects(statedb.Collect(l.pes.List(txn, endpoints.PolicyEndpointParentIndex.Query(parent))))
	}, func(o endpoints.Object) []endpoints.NameRule {
		pe := o.(*endpoints.PolicyEndpoint)
		if !pe.IsolatesEgress {
			return nil // not isolated in egress: everything is allowed
		}
		return pe.EgressNames
	})
	cpes := statedb.Collect(l.cpes.List(txn, endpoints.ClusterPolicyEndpointPodIndex.Query(pod)))
	collect(policybpf.TierCluster, "ClusterPolicyEndpoint", asObjects(cpes), func(parent string) []endpoints.Object {
		return asObjects(statedb.Collect(l.cpes.List(txn, endpoints.ClusterPolicyEndpointParentIndex.Query(parent))))
	}, func(o endpoints.Object) []endpoints.NameRule { return o.(*endpoints.ClusterPolicyEndpoint).EgressNames })
	return out, podName
}

func asObjects[T endpoints.Object](in []T) []endpoints.Object {
	out := make([]endpoints.Object, len(in))
	for i, o := range in {
		out[i] = o
	}
	return out
}

// errNotApplied is the answer held past MaxDelay: the pod gets SERVFAIL.
var errNotApplied = errors.New("the answer's addresses are not in the kernel in time")

// learn is the proxy's hook: it writes what the answer teaches and waits
// until the kernel has it. An error fails the lookup (SERVFAIL).
func (l *learner) learn(ctx context.Context, q dnsproxy.Query) error {
	start := time.Now()
	l.metrics.lookup()
	answers := answersOf(q.Answer)
	if len(answers) == 0 {
		return nil
	}
	rules, podName := l.rulesOf(l.db.ReadTxn(), q.Pod)
	if len(rules) == 0 {
		return nil // no longer selected: nothing to learn
	}
	var tiers []policybpf.PolicyTier
	type learnt struct {
		answered
		from []string
	}
	var learnts []learnt
	for _, a := range answers {
		var from []string
		for _, m := range rules {
			if m.rule.Matches(a.Name) {
				from = append(from, m.from)
				if !slices.Contains(tiers, m.tier) {
					tiers = append(tiers, m.tier)
				}
			}
		}
		if len(from) > 0 && len(a.IPs) > 0 {
			slices.Sort(from)
			learnts = append(learnts, learnt{a, slices.Compact(from)})
		}
	}
	if len(learnts) == 0 {
		return nil
	}

	// Write: new addresses, and expiries pushed out.
	now := l.now()
	wtxn := l.db.WriteTxn(l.names)
	var need statedb.Revision // the revision the kernel must have
	var grew []*endpoints.DNSName
	for _, lt := range learnts {
		ttl := min(max(lt.TTL, l.settings.MinTTL, minLife), maxLife)
		row, rev, ok := l.names.Get(wtxn, endpoints.DNSNameQuery(q.Pod, lt.Name))
		if ok && row.PodName != podName {
			ok = false // another pod's, whose IP this pod has now
		}
		next, added, dropped := merge(row, ok, q.Pod, podName, lt.Name, lt.IPs, now.Add(ttl), lt.from, l.settings.MaxIPsPerName)
		l.metrics.dropped(dropped)
		if next == nil { // unchanged but for a small push of expiry
			if r := l.changedAt(row.Key(), rev); r > need {
				need = r
			}
			continue
		}
		l.evictOver(wtxn, q.Pod, lt.Name, len(next.IPs))
		if _, _, err := l.names.Insert(wtxn, next); err != nil {
			wtxn.Abort()
			return fmt.Errorf("write %s: %w", endpoints.DNSNamesTableName, err)
		}
		if added {
			grew = append(grew, next)
			// An address the pod holds already under the same rules (a
			// flood of names that all answer one address) is in the
			// kernel once that row's is: wait for that one.
			if held, r := l.heldUnder(wtxn, q.Pod, podName, lt.Name, lt.IPs, lt.from); held {
				l.learntAt(next.Key(), r)
			} else {
				l.learntAt(next.Key(), l.names.Revision(wtxn))
			}
		}
		if r := l.changedAt(next.Key(), 0); r > need {
			need = r
		}
	}
	wtxn.Commit()
	l.journal(grew) // before the answer: a restart keeps it
	l.metrics.applied(len(learnts))
	if need == 0 {
		return nil
	}
	err := l.waitApplied(ctx, q.Pod, tiers, need)
	l.metrics.toKernel(time.Since(start), err == nil)
	return err
}

// merge returns the row of a pod and name with ips added, all expiring
// no earlier than expires, nil if nothing changed but expiries pushed out
// by less than refreshSlack. It keeps at most max addresses: the answer's,
// then those that expire last (dropped counts the others).
func merge(row *endpoints.DNSName, ok bool, pod netip.Addr, podName, name string, ips []netip.Addr, expires time.Time, from []string, maxIPs int) (next *endpoints.DNSName, added bool, dropped int) {
	changed := !ok
	var out []endpoints.NameIP
	if ok {
		out = slices.Clone(row.IPs)
		if !slices.Equal(row.Rules, from) {
			changed = true
		}
	}
	for _, ip := range ips {
		i := slices.IndexFunc(out, func(n endpoints.NameIP) bool { return n.IP == ip })
		switch {
		case i < 0:
			out = append(out, endpoints.NameIP{IP: ip, Expires: expires})
			changed, added = true, true
		case out[i].Expires.Add(refreshSlack).Before(expires):
			out[i].Expires = expires
			changed = true
		}
	}
	if !changed {
		return nil, false, 0
	}
	if len(out) > maxIPs {
		// The answer's own addresses stay (the pod is about to use
		// them); of the others, those that expire last.
		slices.SortStableFunc(out, func(a, b endpoints.NameIP) int {
			if ia, ib := slices.Contains(ips, a.IP), slices.Contains(ips, b.IP); ia != ib {
				if ia {
					return -1
				}
				return 1
			}
			return b.Expires.Compare(a.Expires)
		})
		dropped = len(out) - maxIPs
		out = out[:maxIPs]
	}
	slices.SortFunc(out, func(a, b endpoints.NameIP) int { return a.IP.Compare(b.IP) })
	return &endpoints.DNSName{Pod: pod, PodName: podName, Name: name, IPs: out, Rules: from}, added, dropped
}

// heldUnder reports whether every address of ips is held by another row
// of the pod with the same rules, and the newest revision at which those
// rows' addresses grew (what the kernel must have for them).
func (l *learner) heldUnder(txn statedb.ReadTxn, pod netip.Addr, podName, name string, ips []netip.Addr, from []string) (bool, statedb.Revision) {
	var rev statedb.Revision
	for _, ip := range ips {
		found := false
		for row, r := range l.names.List(txn, endpoints.DNSNamePodIndex.Query(pod)) {
			if row.Name == name || row.PodName != podName || !slices.Equal(row.Rules, from) ||
				!slices.ContainsFunc(row.IPs, func(n endpoints.NameIP) bool { return n.IP == ip }) {
				continue
			}
			found, rev = true, max(rev, l.changedAt(row.Key(), r))
			break
		}
		if !found {
			return false, 0
		}
	}
	return true, rev
}

// An answer's addresses stay at least minLife, whatever its TTL: a TTL 0
// answer is used right after it is given (and must not be swept before
// the pod connects); and at most maxLife, whatever its TTL (an answer
// cannot allow an address for years).
const (
	minLife = 5 * time.Second
	maxLife = 24 * time.Hour
)

// refreshSlack is how far an expiry may lag before a lookup writes it
// again: a pod that asks a thousand times a second writes its row about
// once a second, not a thousand times.
const refreshSlack = time.Second

// evictOver makes room for a pod's row of name holding n addresses: past
// MaxNamesPerPod names or MaxIPsPerPod addresses (every address is a key
// of the pod in the node's shared policy map), the other rows that
// expire first go, their addresses with them.
func (l *learner) evictOver(wtxn statedb.WriteTxn, pod netip.Addr, name string, n int) {
	var others []*endpoints.DNSName
	ips := n
	for r := range l.names.List(wtxn, endpoints.DNSNamePodIndex.Query(pod)) {
		if r.Name != name {
			others = append(others, r)
			ips += len(r.IPs)
		}
	}
	slices.SortFunc(others, func(a, b *endpoints.DNSName) int { return lastExpiry(a).Compare(lastExpiry(b)) })
	for _, r := range others {
		if len(others) < l.settings.MaxNamesPerPod && ips <= l.settings.MaxIPsPerPod {
			break
		}
		l.names.Delete(wtxn, r)
		l.forget(r.Key())
		l.metrics.dropped(len(r.IPs))
		others, ips = others[1:], ips-len(r.IPs)
	}
}

func lastExpiry(r *endpoints.DNSName) time.Time {
	var t time.Time
	for _, ip := range r.IPs {
		if ip.Expires.After(t) {
			t = ip.Expires
		}
	}
	return t
}

// waitApplied waits until the kernel holds policy-fqdn up to rev for the
// pod in every tier given, or MaxDelay has passed.
func (l *learner) waitApplied(ctx context.Context, pod netip.Addr, tiers []policybpf.PolicyTier, rev statedb.Revision) error {
	ctx, cancel := context.WithTimeout(ctx, l.settings.MaxDelay)
	defer cancel()
	for {
		done, watch := l.applied.Applied(l.db.ReadTxn(), pod, tiers, rev)
		if done {
			return nil
		}
		select {
		case <-watch:
		case <-ctx.Done():
			l.reportLate(pod)
			return fmt.Errorf("pod %s: %w (after %s)", pod, errNotApplied, l.settings.MaxDelay)
		}
	}
}
