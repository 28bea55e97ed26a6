package compile

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

func TestNested(t *testing.T) {
	for _, tc := range []struct {
		prefixes []string
		want     bool
	}{
		{nil, false},
		{[]string{"10.0.0.1/32", "10.0.0.2/32", "10.0.0.1/32"}, false},
		{[]string{"10.0.0.0/24", "10.0.1.0/24", "10.1.0.0/16"}, false},
		{[]string{"10.0.0.0/24", "10.0.0.7/32"}, true},
		{[]string{"10.0.0.7/32", "10.0.0.0/24"}, true},
		{[]string{"10.0.0.0/24", "10.0.0.0/25"}, true},
		{[]string{"0.0.0.0/0", "192.168.0.1/32"}, true},
		{[]string{"10.0.0.0/25", "10.0.0.128/25", "10.0.1.0/24", "10.0.0.200/32"}, true},
		{[]string{"fd00::/64", "fd00:0:0:1::/64"}, false},
		{[]string{"fd00::/48", "fd00:0:0:1::5/128"}, true},
	} {
		var ps []netip.Prefix
		for _, s := range tc.prefixes {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		if got := nested(ps); got != tc.want {
			t.Errorf("nested(%v) = %t, want %t", tc.prefixes, got, tc.want)
		}
	}
}

// editRows is a pod's rows of a compilation at version 1, by key at
// version 0 (as versionDiff holds them), with a status.
func editRows[K entryKind](entries []*MapEntry[K], status reconciler.Status) map[PolicyEntryKey]*MapEntry[K] {
	out := map[PolicyEntryKey]*MapEntry[K]{}
	for _, e := range entries {
		r := e.atVersion(1)
		r.Status = status
		k := r.Key()
		k.Version = 0
		out[k] = r
	}
	return out
}

// TestEditInPlace: which changes of one pod's policy are edited in place.
func TestEditInPlace(t *testing.T) {
	pod := netip.MustParseAddr("10.0.0.5")
	spec := func(egress string) string {
		return "  podIsolation: [Egress]\n  podSelectorEndpoints: [{hostIP: 10.0.0.1, podIP: 10.0.0.5}]\n  egress:\n" + egress
	}
	for _, tc := range []struct {
		name          string
		before, after string
		inPlace       bool
		fresh, stale  int
	}{
		{"a peer replaced", "  - {cidr: 10.2.0.7/32, ports: [{port: 80}]}\n", "  - {cidr: 10.2.0.8/32, ports: [{port: 80}]}\n", true, 1, 1},
		{"a peer added", "  - {cidr: 10.2.0.7/32, ports: [{port: 80}]}\n",
			"  - {cidr: 10.2.0.7/32, ports: [{port: 80}]}\n  - {cidr: 10.2.0.9/32, ports: [{port: 80}]}\n", true, 1, 0},
		{"a port changed", "  - {cidr: 10.2.0.0/16, ports: [{port: 80}]}\n", "  - {cidr: 10.2.0.0/16, ports: [{port: 81}]}\n", true, 1, 0},
		{"an except moved", "  - {cidr: 10.2.0.0/16, except: [10.2.3.0/24]}\n", "  - {cidr: 10.2.0.0/16, except: [10.2.3.0/25]}\n", false, 0, 0},
		{"a cidr and its except added", "  - {cidr: 10.2.0.7/32}\n",
			"  - {cidr: 10.2.0.7/32}\n  - {cidr: 10.3.0.0/16, except: [10.3.1.0/24]}\n", false, 0, 0},
		{"a wider cidr over a peer it changes", "  - {cidr: 10.2.0.7/32, ports: [{port: 443}]}\n",
			"  - {cidr: 10.2.0.7/32, ports: [{port: 443}]}\n  - {cidr: 10.2.0.0/16, ports: [{port: 80}]}\n", false, 0, 0},
		{"a wider cidr over a peer it leaves alone", "  - {cidr: 10.2.0.7/32}\n",
			"  - {cidr: 10.2.0.7/32}\n  - {cidr: 10.2.0.0/16, ports: [{port: 80}]}\n", true, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := CompilePod(pod, mustParse(t, pe("p", spec(tc.before))))
			after := CompilePod(pod, mustParse(t, pe("p", spec(tc.after))))
			fresh, stale, ok := editInPlace(editRows(before, reconciler.StatusDone()), after, 1)
			if ok != tc.inPlace {
				t.Fatalf("in place: %t, want %t", ok, tc.inPlace)
			}
			if ok && (len(fresh) != tc.fresh || len(stale) != tc.stale) {
				t.Errorf("%d rows written, %d deleted; want %d and %d", len(fresh), len(stale), tc.fresh, tc.stale)
			}
			for _, f := range fresh {
				if f.Version != 1 || f.Status.Kind != reconciler.StatusKindPending {
					t.Errorf("a row of the edit at version %d, %s: want the version in force, Pending", f.Version, f.Status.Kind)
				}
			}
		})
	}

	// A row of an earlier edit the kernel does not hold yet counts as
	// touched: a peer replaced under a pending wider key is not in place.
	before := CompilePod(pod, mustParse(t, pe("p", spec("  - {cidr: 10.2.0.0/16, ports: [{port: 80}]}\n  - {cidr: 10.2.0.7/32}\n"))))
	after := CompilePod(pod, mustParse(t, pe("p", spec("  - {cidr: 10.2.0.0/16, ports: [{port: 80}]}\n  - {cidr: 10.2.0.8/32}\n"))))
	rows := editRows(before, reconciler.StatusDone())
	if _, _, ok := editInPlace(rows, after, 1); !ok {
		t.Fatal("a peer replaced under settled keys: not in place")
	}
	for k, r := range rows {
		if k.Peer == netip.MustParsePrefix("10.2.0.0/16") {
			c := r.Clone()
			c.Status = reconciler.StatusError(errTest)
			rows[k] = c
		}
	}
	if _, _, ok := editInPlace(rows, after, 1); ok {
		t.Error("a peer replaced under a wider key the kernel refused: in place")
	}
}

var errTest = errorString("refused by the test")

type errorString string

func (e errorString) Error() string { return string(e) }

// mutate returns a copy of s with one small change, as the AWS controller
// makes them: a rule's peer replaced, a rule added or removed, a port
// changed, an except added or removed.
func mutate(rng *rand.Rand, s scenario) scenario {
	c := s.clone()
	if len(c.PEs) == 0 {
		return c
	}
	pe := &c.PEs[rng.IntN(len(c.PEs))]
	rules := &pe.Egress
	if rng.IntN(2) == 0 {
		rules = &pe.Ingress
	}
	v6 := rng.IntN(2) == 0
	switch op := rng.IntN(5); {
	case op == 0 || len(*rules) == 0:
		*rules = append(*rules, genRule(rng, v6))
	case op == 1:
		i := rng.IntN(len(*rules))
		*rules = append((*rules)[:i], (*rules)[i+1:]...)
	case op == 2:
		r := &(*rules)[rng.IntN(len(*rules))]
		r.CIDR, r.Except = genPrefix(rng, netip.MustParsePrefix(r.CIDR).Addr().Is6()).String(), nil
	case op == 3:
		r := &(*rules)[rng.IntN(len(*rules))]
		r.Ports = genRule(rng, v6).Ports
	default:
		r := &(*rules)[rng.IntN(len(*rules))]
		if len(r.Except) > 0 {
			r.Except = r.Except[:len(r.Except)-1]
		} else {
			r.Except = append(r.Except, genExcept(rng, netip.MustParsePrefix(r.CIDR)).String())
		}
	}
	return c
}

// applyEdit is the kernel's entries of a pod after the operations of an
// edit that are in applied: from rows, the stale rows deleted and the
// fresh ones written.
func applyEdit[K entryKind](rows map[PolicyEntryKey]*MapEntry[K], fresh, stale []*MapEntry[K], applied func() bool) map[PolicyEntryKey]*MapEntry[K] {
	out := map[PolicyEntryKey]*MapEntry[K]{}
	for k, r := range rows {
		out[k] = r
	}
	for _, r := range stale {
		if applied() {
			k := r.Key()
			k.Version = 0
			delete(out, k)
		}
	}
	for _, r := range fresh {
		if applied() {
			k := r.Key()
			k.Version = 0
			out[k] = r
		}
	}
	return out
}

func entriesOf[K entryKind](rows map[PolicyEntryKey]*MapEntry[K]) []*MapEntry[K] {
	out := make([]*MapEntry[K], 0, len(rows))
	for _, r := range rows {
		out = append(out, r)
	}
	return out
}

// TestEditInPlaceIsWithinBothEnds: for random policies and random small
// changes of them, an edit that editInPlace takes, applied in any part
// (the reconciler's order, or an entry the kernel refuses), never allows a
// packet that neither the policy before nor the one after allows; and
// after an edit that is not whole (some of its entries pending or
// refused), the next edit taken in place keeps every packet within the
// three policies. Whole, an edit is exactly the new compilation.
func TestEditInPlaceIsWithinBothEnds(t *testing.T) {
	seed := propertySeed(t)
	rng := rand.New(rand.NewPCG(seed, 45))
	scenarios, parts := 600, 6
	if testing.Short() {
		scenarios = 100
	}
	inPlace, checked := 0, 0
	for i := range scenarios {
		a := genScenario(rng, true)
		b := mutate(rng, a)
		c := mutate(rng, b)
		pa, pb, pc := a.parse(t), b.parse(t), c.parse(t)
		packets := append(append(genPackets(rng, a, true, 30), genPackets(rng, b, true, 30)...), genPackets(rng, c, true, 30)...)
		for _, pod := range a.podIPs() {
			ea, eb, ec := CompilePod(pod, pa), CompilePod(pod, pb), CompilePod(pod, pc)
			if len(ea) == 0 || len(eb) == 0 {
				continue
			}
			rows := editRows(ea, reconciler.StatusDone())
			fresh, stale, ok := editInPlace(rows, eb, 1)
			if !ok {
				continue
			}
			inPlace++
			whole := applyEdit(rows, fresh, stale, func() bool { return true })
			if got, want := entryLines(entriesOf(whole)), entryLines(eb); !sameLines(got, want) {
				t.Fatalf("seed %d, scenario %d, pod %s: the whole edit is not the new compilation:\n%v\nwant\n%v", seed, i, pod, got, want)
			}
			for range parts {
				var left []*PolicyMapEntry // the edit's rows not in the kernel
				kernel := applyEdit(rows, fresh, stale, func() bool { return rng.IntN(2) == 0 })
				for _, f := range fresh {
					k := f.Key()
					k.Version = 0
					if kernel[k] != f {
						left = append(left, f)
					}
				}
				for _, p := range packets {
					if p.Pod != pod {
						continue
					}
					checked++
					if evalEntries(entriesOf(kernel), p) && !evalEntries(ea, p) && !evalEntries(eb, p) {
						t.Fatalf("seed %d, scenario %d: packet %s allowed by a part of the edit, by neither end\nbefore:\n%s\nafter:\n%s", seed, i, p, a.render(), b.render())
					}
				}
				// The next edit, with the rows left Pending in the table
				// (deletions are in the kernel: the reconciler deletes
				// before it writes, in revision order).
				if len(ec) == 0 {
					continue
				}
				table := editRows(eb, reconciler.StatusDone())
				for _, l := range left {
					k := l.Key()
					k.Version = 0
					table[k] = l // Pending
				}
				fresh2, stale2, ok := editInPlace(table, ec, 1)
				if !ok {
					continue
				}
				kernel2 := applyEdit(kernel, fresh2, stale2, func() bool { return rng.IntN(2) == 0 })
				for _, p := range packets {
					if p.Pod != pod {
						continue
					}
					checked++
					if evalEntries(entriesOf(kernel2), p) && !evalEntries(ea, p) && !evalEntries(eb, p) && !evalEntries(ec, p) {
						t.Fatalf("seed %d, scenario %d: packet %s allowed after two unfinished edits, by no policy on the way\n%s\n%s\n%s", seed, i, p, a.render(), b.render(), c.render())
					}
				}
			}
		}
	}
	if inPlace < scenarios/10 {
		t.Errorf("only %d edits in place in %d scenarios: the test checks too little", inPlace, scenarios)
	}
	t.Logf("%d edits in place, %d packets checked", inPlace, checked)
}

func sameLines(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]int{}
	for _, s := range a {
		seen[s]++
	}
	for _, s := range b {
		seen[s]--
	}
	for _, n := range seen {
		if n != 0 {
			return false
		}
	}
	return true
}

// TestPodQueueOldestFirst: batches are worked in the order they came; a pod
// queued again stays where it is; a batch that had its turn goes behind
// the others.
func TestPodQueueOldestFirst(t *testing.T) {
	a := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}) }
	var q podQueue[policyKind]
	q.push([]netip.Addr{a(1), a(2)})
	q.push([]netip.Addr{a(3)})
	q.push([]netip.Addr{a(2), a(4)}) // 2 stays in the first batch
	var got []netip.Addr
	q.next()
	for {
		pod, _, _, ok := q.pop(false)
		if !ok {
			break
		}
		got = append(got, pod)
	}
	want := []netip.Addr{a(1), a(2), a(3), a(4)}
	if len(got) != len(want) {
		t.Fatalf("worked %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("worked %v, want %v", got, want)
		}
	}
	if !q.empty() {
		t.Error("work left")
	}

	// A large batch has its turn; a small one that comes after goes next.
	q.push([]netip.Addr{a(10), a(11), a(12)})
	q.next()
	if pod, _, _, _ := q.pop(false); pod != a(10) {
		t.Fatalf("first %s, want %s", pod, a(10))
	}
	q.push([]netip.Addr{a(20)})
	q.next()
	if pod, _, _, _ := q.pop(false); pod != a(20) {
		t.Errorf("after a turn of the large batch: %s, want the small batch's %s", pod, a(20))
	}
	if pod, _, _, _ := q.pop(false); pod != a(11) {
		t.Errorf("then %s, want the large batch's %s", pod, a(11))
	}
	// Only new changes while the reconciler is behind: the untouched batch.
	q.push([]netip.Addr{a(30)})
	if !q.hasWork(true) {
		t.Fatal("a new change has no work")
	}
	q.next()
	if pod, _, _, _ := q.pop(true); pod != a(30) {
		t.Errorf("only fresh work: %s, want %s", pod, a(30))
	}
	if _, _, _, ok := q.pop(false); !ok {
		t.Error("the large batch's rest is gone")
	}
}

// mutateCluster returns a copy of s with one small change of a
// ClusterPolicyEndpoint: a rule's cidr, action or ports changed, a rule
// added or removed.
func mutateCluster(rng *rand.Rand, s clusterScenario) clusterScenario {
	c := s.clone()
	if len(c.CPEs) == 0 {
		return c
	}
	cpe := &c.CPEs[rng.IntN(len(c.CPEs))]
	if cpe.StandIn {
		return c
	}
	rules := &cpe.Egress
	if rng.IntN(2) == 0 {
		rules = &cpe.Ingress
	}
	v6 := rng.IntN(2) == 0
	newRule := func() rawClusterRule {
		return rawClusterRule{CIDR: genClusterPrefix(rng, v6).String(), Ports: genPorts(rng), Action: []string{"Accept", "Deny", "Pass"}[rng.IntN(3)]}
	}
	switch op := rng.IntN(5); {
	case op == 0 || len(*rules) == 0:
		*rules = append(*rules, newRule())
	case op == 1:
		i := rng.IntN(len(*rules))
		*rules = append((*rules)[:i], (*rules)[i+1:]...)
	case op == 2:
		r := &(*rules)[rng.IntN(len(*rules))]
		r.CIDR = genClusterPrefix(rng, netip.MustParsePrefix(r.CIDR).Addr().Is6()).String()
	case op == 3:
		r := &(*rules)[rng.IntN(len(*rules))]
		r.Action = []string{"Accept", "Deny", "Pass"}[rng.IntN(3)]
	default:
		r := &(*rules)[rng.IntN(len(*rules))]
		r.Ports = genPorts(rng)
	}
	return c
}

// TestClusterEditInPlaceIsWithinBothEnds: the same for the cluster tier,
// the NetworkPolicy tier as it is (a tier is edited only while the other
// is quiet): any part of an edit in place of a pod's cluster entries, with
// its NetworkPolicy entries, never allows what both ends deny, in standard
// and strict mode.
func TestClusterEditInPlaceIsWithinBothEnds(t *testing.T) {
	seed := propertySeed(t)
	rng := rand.New(rand.NewPCG(seed, 46))
	node := nodeconfig.Config{EnableIPv4: true, EnableIPv6: true}
	scenarios := 600
	if testing.Short() {
		scenarios = 100
	}
	inPlace, checked := 0, 0
	for i := range scenarios {
		a := genClusterScenario(rng, true)
		b := mutateCluster(rng, a)
		np, ca := compileClusterScenario(t, a, node)
		_, cb := compileClusterScenario(t, b, node)
		var packets []packet
		for _, s := range []clusterScenario{a, b} {
			packets = append(packets, genClusterPackets(rng, s, true, 40)...)
		}
		for _, pod := range a.NP.podIPs() {
			var before, after []*ClusterMapEntry
			for _, e := range ca {
				if e.Pod == pod {
					before = append(before, e)
				}
			}
			for _, e := range cb {
				if e.Pod == pod {
					after = append(after, e)
				}
			}
			if len(before) == 0 || len(after) == 0 {
				continue
			}
			rows := editRows(before, reconciler.StatusDone())
			fresh, stale, ok := editInPlace(rows, after, 1)
			if !ok {
				continue
			}
			inPlace++
			for range 6 {
				kernel := entriesOf(applyEdit(rows, fresh, stale, func() bool { return rng.IntN(2) == 0 }))
				for _, p := range packets {
					if p.Pod != pod {
						continue
					}
					for _, strict := range []bool{false, true} {
						checked++
						if evalClusterEntries(np, kernel, strict, p).Allow && !evalClusterEntries(np, before, strict, p).Allow &&
							!evalClusterEntries(np, after, strict, p).Allow {
							t.Fatalf("seed %d, scenario %d: packet %s (strict %t) allowed by a part of the edit, by neither end\nbefore:\n%s\nafter:\n%s",
								seed, i, p, strict, strings.Join(clusterEntryLines(before), "\n"), strings.Join(clusterEntryLines(after), "\n"))
						}
					}
				}
			}
		}
	}
	if inPlace < scenarios/10 {
		t.Errorf("only %d edits in place in %d scenarios: the test checks too little", inPlace, scenarios)
	}
	t.Logf("%d edits in place, %d packets checked", inPlace, checked)
}

// templatesOfPod compiles a pod's templates as the deriver does.
func templatesOfPod(pod netip.Addr, pes []*endpoints.PolicyEndpoint) []*policyTemplate {
	entry := func(pe *endpoints.PolicyEndpoint) (endpoints.PodEndpoint, bool) { return pe.PodEntry(pod) }
	sel, ok := selectionOf(pod, newObjectSet(endpoints.UnionOf(pod, pes)), pes, entry)
	if !ok {
		return nil
	}
	return compileSelection(sel)
}

// TestDiffTemplatesIsTheRowsEdit: the edit computed once from a
// selection's templates (delta.go) is the edit computed from each pod's
// rows (editInPlace): taken alike, with the same rows written and the
// same keys deleted, on random policies and random small changes.
func TestDiffTemplatesIsTheRowsEdit(t *testing.T) {
	seed := propertySeed(t)
	rng := rand.New(rand.NewPCG(seed, 47))
	compared, inPlace := 0, 0
	for i := range 400 {
		a := genScenario(rng, true)
		b := mutate(rng, a)
		pa, pb := a.parse(t), b.parse(t)
		for _, pod := range a.podIPs() {
			ta, tb := templatesOfPod(pod, pa), templatesOfPod(pod, pb)
			if ta == nil || tb == nil {
				continue
			}
			rows := editRows(stampAll[policyKind](ta, pod), reconciler.StatusDone())
			fresh, stale, ok := editInPlace(rows, stampAll[policyKind](tb, pod), 1)
			delta := diffTemplates(ta, tb)
			compared++
			if ok != delta.ok {
				t.Fatalf("seed %d, scenario %d, pod %s: from the rows in place %t, from the templates %t\n%s\n%s", seed, i, pod, ok, delta.ok, a.render(), b.render())
			}
			if !ok {
				continue
			}
			inPlace++
			if len(delta.fresh) == 0 && len(delta.gone) > 0 {
				fresh = fresh[:len(fresh)-1] // the rows' witness (editByDelta adds its own)
			}
			var want, got []string
			for _, f := range fresh {
				want = append(want, strings.Join(f.TableRow(), " "))
			}
			for _, e := range delta.fresh {
				got = append(got, strings.Join((&PolicyMapEntry{Pod: pod, Version: 1, Status: reconciler.StatusPending(), t: e}).TableRow(), " "))
			}
			for _, s := range stale {
				want = append(want, "gone "+s.Map()+" "+s.Peer().String())
			}
			for _, g := range delta.gone {
				got = append(got, "gone "+g.mapName+" "+g.peer.String())
			}
			if !sameLines(got, want) {
				t.Fatalf("seed %d, scenario %d, pod %s: the templates' edit\n%s\nthe rows' edit\n%s", seed, i, pod, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		}
	}
	if inPlace < 100 {
		t.Errorf("only %d of %d compared edits in place", inPlace, compared)
	}
	t.Logf("%d pods compared, %d edits in place", compared, inPlace)
}
