package compile

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/prefixorder"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// The compilation of ClusterPolicyEndpoints into the cluster maps
// (enimasq_cluster_egress_v4, ...): per pod and direction, one key per
// boundary prefix (the root, every rule's cidr, the node IP), whose value
// holds, for every interval of the port space, the Admin tier's winner and
// the Baseline tier's, so that the program decides a tier with one search.
//
// A tier's winner for a peer and port is the rule of the lowest priority
// number among the rules whose cidr holds the peer and whose ports hold the
// port; at one priority Deny over Accept over Pass (the AWS agent v1.5.0,
// pkg/ebpf/c/tc.v4egress.bpf.c evaluateClusterPolicyByLookUp: priority*10 +
// action, Deny 0, Accept 1, Pass 2, the lowest wins). A Pass wins like the
// others and decides nothing: the packet goes to the next step. As in
// v1.5.0 (fw_rule_processor.go ComputeClusterPolicyMapEntriesFromEndpointRules),
// the node's own IP is accepted at the top of the Admin tier: kubelet probes
// are never blocked. A stand-in (a ClusterPolicyEndpoint that cannot be
// read and has no last good version) denies everything else, in both
// directions, above every priority: never more open than before.

// Sort keys above every priority of the API (0..1000).
const (
	nodePriority    = -2
	standInPriority = -1
)

// clusterRule is one rule of a tier, ready to paint.
type clusterRule struct {
	tier     endpoints.Tier
	priority int
	action   policybpf.Action // ActionNone for Pass
	rank     int              // Deny 0, Accept 1, Pass 2
	cidr     netip.Prefix
	ports    []policybpf.Interval // Lo, Hi only
	object   uint32
	name     string
	order    int // position, for a deterministic order
}

// everyPort is the whole port space.
var everyPort = []policybpf.Interval{{Lo: 0, Hi: policybpf.PortSpaceEnd}}

// portIntervals are the intervals of a rule's ports (none: every port).
func portIntervals(ports []endpoints.Port) []policybpf.Interval {
	if len(ports) == 0 {
		return everyPort
	}
	entries := make([]policybpf.PortEntry, len(ports))
	for i, p := range ports {
		entries[i] = policybpf.PortEntry{Protocol: p.Protocol, StartPort: uint32(p.Port), EndPort: uint32(p.EndPort)}
	}
	return policybpf.AllowIntervals(entries, 0)
}

func actionOf(a endpoints.Action) (policybpf.Action, int) {
	switch a {
	case endpoints.ActionDeny:
		return policybpf.ActionDeny, 0
	case endpoints.ActionAccept:
		return policybpf.ActionAccept, 1
	}
	return policybpf.ActionNone, 2 // Pass
}

// clusterObjectKind names ClusterPolicyEndpoints in object ids.
const clusterObjectKind = "ClusterPolicyEndpoint"

// ClusterObjectID is the id of a ClusterPolicyEndpoint in the cluster maps'
// outcomes, the program's verdicts and its events.
func ClusterObjectID(name string) uint32 { return policybpf.ObjectID(clusterObjectKind, name) }

// rulesOf returns the rules of the selection in a direction, of its
// family, with the node IPs and stand-ins first.
func rulesOf(s selection[*endpoints.ClusterPolicyEndpoint], d policybpf.Direction) []clusterRule {
	root := netip.PrefixFrom(rootAddr(s.family), 0)
	var rules []clusterRule
	for _, h := range s.hosts {
		rules = append(rules, clusterRule{tier: endpoints.TierAdmin, priority: nodePriority, action: policybpf.ActionAccept, rank: 1,
			cidr: netip.PrefixFrom(h, h.BitLen()), ports: everyPort, name: "node IP " + h.String()})
	}
	for _, c := range s.objs {
		id := ClusterObjectID(c.Name)
		if c.StandIn {
			rules = append(rules, clusterRule{tier: endpoints.TierAdmin, priority: standInPriority, action: policybpf.ActionDeny,
				cidr: root, ports: everyPort, object: id, name: c.Name})
			continue
		}
		for _, r := range c.Rules(d) {
			if !r.CIDR.IsValid() || bpf.FamilyOf(r.CIDR.Addr()) != s.family {
				continue // of the other family: inert for this pod
			}
			a, rank := actionOf(r.Action)
			rules = append(rules, clusterRule{tier: c.Tier, priority: int(c.Priority), action: a, rank: rank,
				cidr: r.CIDR.Masked(), ports: portIntervals(r.Ports), object: id, name: c.Name})
		}
	}
	for i := range rules {
		rules[i].order = i
	}
	slices.SortStableFunc(rules, func(a, b clusterRule) int {
		return cmp.Or(cmp.Compare(a.priority, b.priority), cmp.Compare(a.rank, b.rank))
	})
	return rules
}

func rootAddr(f bpf.Family) netip.Addr {
	if f == bpf.IPv6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// compileClusterSelection returns the templates of a selection's cluster
// entries, egress first.
func compileClusterSelection(sel selection[*endpoints.ClusterPolicyEndpoint]) []*policyTemplate {
	out := make([]*policyTemplate, 0, 2)
	for _, d := range []policybpf.Direction{policybpf.Egress, policybpf.Ingress} {
		out = append(out, compileClusterDirection(sel, d))
	}
	return out
}

func compileClusterDirection(sel selection[*endpoints.ClusterPolicyEndpoint], d policybpf.Direction) *policyTemplate {
	t := &policyTemplate{mapName: policybpf.ClusterMapName(d, sel.family)}
	rules := rulesOf(sel, d)
	root := netip.PrefixFrom(rootAddr(sel.family), 0)
	bounds := []netip.Prefix{root}
	for _, r := range rules {
		bounds = append(bounds, r.cidr)
	}
	slices.SortFunc(bounds, prefixorder.Compare)
	bounds = slices.Compact(bounds)
	// Written longest first: the reconciler writes in that order, so a
	// narrower key (a Deny inside an Accept) is in the kernel before the
	// wider one that would otherwise decide for it.
	slices.SortStableFunc(bounds, func(a, b netip.Prefix) int { return cmp.Compare(b.Bits(), a.Bits()) })
	values := map[string]*portValue{}
	var covering []*clusterRule
	for _, b := range bounds {
		covering = covering[:0]
		for i := range rules {
			if r := &rules[i]; r.cidr.Bits() <= b.Bits() && r.cidr.Contains(b.Addr()) {
				covering = append(covering, r)
			}
		}
		v := paintTiers(covering)
		pv := newPortValue(v)
		// Interned by the bytes (the value's list id covers the
		// intervals past the inline ones), not by the text, which is cut.
		if seen, ok := values[string(pv.bytes)]; ok {
			pv = seen
		} else {
			pv.text = clusterValueText(v, covering)
			values[string(pv.bytes)] = pv
		}
		t.add(templateEntry{peer: b, value: pv})
	}
	t.done()
	return t
}

// paintTiers computes, for every interval of the port space, each tier's
// winner among rules (sorted: the first that holds a point wins it).
func paintTiers(rules []*clusterRule) *policybpf.PolicyValue {
	var coords []uint32
	for _, r := range rules {
		for _, iv := range r.ports {
			coords = append(coords, iv.Lo, iv.Hi+1)
		}
	}
	slices.Sort(coords)
	coords = slices.Compact(coords)
	if len(coords) < 2 {
		return &policybpf.PolicyValue{}
	}
	n := len(coords) - 1 // segment i: coords[i] .. coords[i+1]-1
	first := make([]policybpf.Outcome, n)
	second := make([]policybpf.Outcome, n)
	for _, tier := range []endpoints.Tier{endpoints.TierAdmin, endpoints.TierBaseline} {
		out := first
		if tier == endpoints.TierBaseline {
			out = second
		}
		// next[i] is the first unpainted segment at or after i (path
		// halving): each segment is painted once, by its winner.
		next := make([]int, n+1)
		for i := range next {
			next[i] = i
		}
		find := func(i int) int {
			for next[i] != i {
				next[i] = next[next[i]]
				i = next[i]
			}
			return i
		}
		for _, r := range rules {
			if r.tier != tier {
				continue
			}
			o := policybpf.NewOutcome(r.action, r.object)
			for _, iv := range r.ports {
				i, _ := slices.BinarySearch(coords, iv.Lo)
				for i = find(i); i < n && coords[i] <= iv.Hi; i = find(i) {
					out[i] = o
					next[i] = i + 1
				}
			}
		}
	}
	v := &policybpf.PolicyValue{}
	for i := range n {
		if first[i].Action() == policybpf.ActionNone && second[i].Action() == policybpf.ActionNone {
			continue // nothing decides here (no rule, or a Pass)
		}
		lo, hi := coords[i], coords[i+1]-1
		if k := len(v.Intervals); k > 0 {
			last := &v.Intervals[k-1]
			if last.Hi+1 == lo && last.First == first[i] && last.Second == second[i] {
				last.Hi = hi
				continue
			}
		}
		v.Intervals = append(v.Intervals, policybpf.Interval{Lo: lo, Hi: hi, First: first[i], Second: second[i]})
	}
	return v
}

// clusterValueText is a value as the table shows it: each interval's ports
// and the Admin and Baseline winners ("tcp/80 admin deny a, baseline
// accept b"), "-" for none.
func clusterValueText(v *policybpf.PolicyValue, rules []*clusterRule) string {
	if len(v.Intervals) == 0 {
		return "-"
	}
	names := map[uint32]string{}
	for _, r := range rules {
		names[r.object] = r.name
	}
	outcome := func(tier string, o policybpf.Outcome) string {
		if o.Action() == policybpf.ActionNone {
			return ""
		}
		return fmt.Sprintf("%s %s %s", tier, o.Action(), names[o.Object()])
	}
	var parts []string
	for i, iv := range v.Intervals {
		if i == shownClusterIntervals {
			parts = append(parts, fmt.Sprintf("and %d more", len(v.Intervals)-i))
			break
		}
		var steps []string
		for _, s := range []string{outcome("admin", iv.First), outcome("baseline", iv.Second)} {
			if s != "" {
				steps = append(steps, s)
			}
		}
		parts = append(parts, policybpf.IntervalText(iv)+" "+strings.Join(steps, ", "))
	}
	return strings.Join(parts, "; ")
}

// shownClusterIntervals is how many intervals a row's text names.
const shownClusterIntervals = 8

// CompileClusterPod returns the cluster entries of a pod IP for every
// direction, from the ClusterPolicyEndpoints that select it: those of cpes
// that list the pod IP and every other slice of their policies
// (endpoints.Union); the rest is ignored. Pure and deterministic.
func CompileClusterPod(pod netip.Addr, cpes []*endpoints.ClusterPolicyEndpoint) []*ClusterMapEntry {
	entry := func(c *endpoints.ClusterPolicyEndpoint) (endpoints.PodEndpoint, bool) { return c.PodEntry(pod) }
	sel, ok := selectionOf(pod, newObjectSet(endpoints.UnionOf(pod, cpes)), cpes, entry)
	if !ok {
		return nil
	}
	var out []*ClusterMapEntry
	for _, t := range compileClusterSelection(sel) {
		out = stamp(t, out, pod)
	}
	return out
}
