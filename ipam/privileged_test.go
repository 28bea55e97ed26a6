package ipam_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/datapath"
)

// Adding a non-masquerade CIDR under running pods adds exactly one rule per
// pod and writes no other row and no other netlink object; removing it
// deletes exactly those.
func TestPrivilegedConfigChangeTouchesOnlyItsRules(t *testing.T) {
	n := newTestNetNS(t, false)
	nl := &countingNetlink{Netlink: n.H}
	dir := newWorkDir(t)
	a := threePodAgent(t, n, nl, dir)

	revisions := func() map[datapath.RuleKey]statedb.Revision {
		m := map[datapath.RuleKey]statedb.Revision{}
		for r, rev := range a.rules.All(a.db.ReadTxn()) {
			m[r.RuleKey] = rev
		}
		return m
	}
	counts := func() [4]int64 {
		return [4]int64{nl.ruleAdds.Load(), nl.ruleDels.Load(), nl.routeReplaces.Load(), nl.routeDels.Load()}
	}
	before, revBefore := counts(), revisions()

	sample, _ := os.ReadFile(filepath.Join(samplesDir, "ip-masq-agent.yaml"))
	peered := strings.Replace(string(sample), "- 10.0.0.0/8\n", "- 10.0.0.0/8\n- 198.18.0.0/15\n", 1)
	celltest.WriteFileAtomic(t, filepath.Join(dir, "config", "ip-masq-agent"), peered)
	withPeered := strings.Replace(sampleCIDRs, "192.168.0.0/16", "192.168.0.0/16 198.18.0.0/15", 1)
	a.waitKernel(kernelRules(withPeered, threePods...))

	after, revAfter := counts(), revisions()
	if d := [4]int64{after[0] - before[0], after[1] - before[1], after[2] - before[2], after[3] - before[3]}; d != [4]int64{3, 0, 0, 0} {
		t.Errorf("adding a CIDR: %d rule adds, %d rule deletes, %d route replaces, %d route deletes; want 3, 0, 0, 0", d[0], d[1], d[2], d[3])
	}
	for k, rev := range revBefore {
		if revAfter[k] != rev {
			t.Errorf("row %s was rewritten (revision %d -> %d)", k, rev, revAfter[k])
		}
	}
	if len(revAfter) != len(revBefore)+3 {
		t.Errorf("%d rows, want %d", len(revAfter), len(revBefore)+3)
	}

	before = counts()
	celltest.WriteFileAtomic(t, filepath.Join(dir, "config", "ip-masq-agent"), string(sample))
	a.waitKernel(kernelRules(sampleCIDRs, threePods...))
	after = counts()
	if d := [4]int64{after[0] - before[0], after[1] - before[1], after[2] - before[2], after[3] - before[3]}; d != [4]int64{0, 3, 0, 0} {
		t.Errorf("removing a CIDR: %d rule adds, %d rule deletes, %d route replaces, %d route deletes; want 0, 3, 0, 0", d[0], d[1], d[2], d[3])
	}
}

// A restart restores the allocations from the checkpoint: no rule is
// duplicated or lost (one deleted while the agent was down comes back), an
// orphaned rule of enimasq's protocol is removed, rules with other
// protocols at the same priority stay, and an allocation whose IP left the
// pool while the agent was down is reported and loses its rules.
func TestPrivilegedRestartRestoresAllocations(t *testing.T) {
	n := newTestNetNS(t, false)
	dir := newWorkDir(t)
	a := threePodAgent(t, n, n.H, dir)
	a.stop()

	raw := func(add bool, args ...string) {
		t.Helper()
		r, err := rawRule(args)
		if err == nil {
			if add {
				err = n.H.RuleAdd(r)
			} else {
				err = n.H.RuleDel(r)
			}
		}
		if err != nil {
			t.Fatalf("raw rule %v: %s", args, err)
		}
	}
	// While the agent is down: one of its rules is lost, an orphan of its
	// protocol appears, and other actors add rules at priority 111.
	raw(false, "111", "10.130.100.134/32", "172.16.0.0/12", "11", "237")
	raw(true, "111", "10.130.100.200/32", "10.0.0.0/8", "11", "237")
	raw(true, "111", "10.130.100.133/32", "10.0.0.0/8", "11", "3")
	raw(true, "111", "10.130.100.250/32", "all", "12", "4")
	othersBefore := otherRules(t, n)

	b := startAgent(t, n, n.H, dir)
	b.waitKernel(kernelRules(sampleCIDRs, threePods...))
	if got := otherRules(t, n); got != othersBefore {
		t.Errorf("rules of other protocols changed:\n%s\nwant:\n%s", got, othersBefore)
	}
	if got := ownRulesCount(t, n); got != 3*6 {
		t.Errorf("%d rules with protocol 237, want 18 (duplicates?)", got)
	}
	// The pool sync moves restored allocations to Allocated after start.
	b.waitFor("restored allocations Allocated", func() (bool, string) {
		var got []string
		for al := range b.allocs.All(b.db.ReadTxn()) {
			got = append(got, al.IP.String()+" "+al.Owner+" "+string(al.State))
		}
		want := []string{"10.130.100.133 shop/a Allocated", "10.130.100.134 shop/b Allocated", "10.130.112.20 shop/c Allocated"}
		return slices.Equal(got, want), fmt.Sprint(got)
	})
	b.stop()

	// Down again: 10.130.112.20 leaves the pool. At start it is reported,
	// its rules and ENI 2's routes go, the others stay.
	node, _ := os.ReadFile(filepath.Join(samplesDir, "ciliumnode.yaml"))
	celltest.WriteFileAtomic(t, filepath.Join(dir, "node", "ciliumnode.yaml"),
		strings.Replace(string(node), "      10.130.112.20:\n        resource: eni-0a1b2c3d4e5f00002\n", "", 1))
	c := startAgent(t, n, n.H, dir)
	c.waitKernel(kernelRules(sampleCIDRs, threePods[:2]...))
	c.waitFor("10.130.112.20 reported orphaned", func() (bool, string) {
		al, _, _ := c.allocs.Get(c.db.ReadTxn(), allocations.AllocationIPIndex.Query(netip.MustParseAddr("10.130.112.20")))
		return al != nil && al.State == allocations.StateOrphaned, fmt.Sprintf("%+v", al)
	})
	// ENI 2's routes go once its last pod's rows are deleted: the deletes
	// are reconciled after the rules converged, so wait for them too.
	c.waitFor("ENI 2's routes removed", func() (bool, string) {
		routes, err := datapath.KernelRoutes(n.H, []int{unix.AF_INET})
		if err != nil {
			return false, err.Error()
		}
		return routes == "table 11: default via 10.130.96.1 dev eni1\ntable 11: 10.130.96.1 dev eni1 scope link\n", routes
	})
	if got := otherRules(t, n); got != othersBefore {
		t.Errorf("rules of other protocols changed:\n%s", got)
	}
}

func otherRules(t testing.TB, n *testNetNS) string {
	all, err := allRules(n.H)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(all, "\n") {
		if l != "" && !strings.HasSuffix(l, " proto 237") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func ownRulesCount(t testing.TB, n *testNetNS) int {
	all, err := allRules(n.H)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(all, " proto 237\n")
}

// A restart while the CiliumNode file is missing changes no rule: the
// desired state is not loaded, so nothing is pruned, however many refresh
// periods pass.
func TestPrivilegedRestartWithoutCiliumNodeKeepsRules(t *testing.T) {
	n := newTestNetNS(t, false)
	dir := newWorkDir(t)
	a := threePodAgent(t, n, n.H, dir)
	a.stop()
	want := kernelRules(sampleCIDRs, threePods...)
	if err := os.Remove(filepath.Join(dir, "node", "ciliumnode.yaml")); err != nil {
		t.Fatal(err)
	}

	startAgentNoWait(t, n, n.H, dir, "--eni-netlink-refresh-interval=50ms")
	// Nothing announces "the agent would have pruned by now": watch the
	// kernel across twenty refresh periods.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got, err := datapath.KernelRules(n.H, []int{unix.AF_INET})
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("rules changed while the CiliumNode was missing:\n%s\nwant:\n%s", got, want)
		}
	}
}

// The egress rule mode switched across restarts, cidr → all → cidr: after
// each start the kernel holds exactly the desired rules and every row is
// Done. The kernel finds "111: from <pod> lookup 11" already there when a
// rule of the same priority, source and table with a destination is, and a
// delete without a destination removes the first such rule: an EEXIST is
// not proof that the rule is in place.
func TestPrivilegedRuleModeSwitchAcrossRestarts(t *testing.T) {
	n := newTestNetNS(t, false)
	dir := newWorkDir(t)
	a := threePodAgent(t, n, n.H, dir)
	a.stop()

	b := startAgent(t, n, n.H, dir, "--eni-egress-rule-mode=all")
	b.waitKernel(kernelRules("", threePods...))
	b.stop()

	c := startAgent(t, n, n.H, dir)
	c.waitKernel(kernelRules(sampleCIDRs, threePods...))
}
