package ipam_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/infra"
	"github.com/enimasq/enimasq/ipam"
	"github.com/enimasq/enimasq/ipmasq"
)

const (
	samplesDir = "../test/testdata/samples"
	// S are the sample config's CIDRs as the sample pods' rules list them.
	sampleCIDRs = "10.0.0.0/8 100.64.0.0/10 169.254.0.0/16 172.16.0.0/12 192.168.0.0/16"
)

// agent is a hive of the cells under test, started, with the objects the
// tests look at.
type agent struct {
	t      testing.TB
	h      *hive.Hive
	log    *slog.Logger
	nl     ipam.Netlink
	db     *statedb.DB
	alloc  *ipam.Allocator
	api    *ipam.API
	allocs statedb.Table[*ipam.Allocation]
	rules  statedb.Table[*ipam.Rule]
	routes statedb.Table[*ipam.Route]
	cidrs  statedb.Table[*ipmasq.CIDR]

	stopped bool
}

// workDir holds the config files of a test: config/ip-masq-agent and
// node/ciliumnode.yaml (the samples) and state/.
func newWorkDir(t testing.TB) string {
	dir := t.TempDir()
	for _, f := range []struct{ src, dst string }{
		{"ip-masq-agent.yaml", "config/ip-masq-agent"},
		{"ciliumnode.yaml", "node/ciliumnode.yaml"},
	} {
		data, err := os.ReadFile(filepath.Join(samplesDir, f.src))
		if err != nil {
			t.Fatal(err)
		}
		writeAtomic(t, filepath.Join(dir, f.dst), string(data))
	}
	return dir
}

func writeAtomic(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".tmp", []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// startAgent starts a hive in the namespace with the files of dir and waits
// until its tables are initialized.
func startAgent(t testing.TB, n *testNetNS, nl ipam.Netlink, dir string, extra ...string) *agent {
	t.Helper()
	a := startAgentNoWait(t, n, nl, dir, extra...)
	a.waitInitialized()
	return a
}

func startAgentNoWait(t testing.TB, n *testNetNS, nl ipam.Netlink, dir string, extra ...string) *agent {
	t.Helper()
	a := &agent{t: t, nl: nl, log: hivetest.Logger(t, hivetest.LogLevel(slog.LevelInfo))}
	cs := append([]cell.Cell{infra.Core, infra.NodeConfigCell}, testCells(n, nl)...)
	cs = append(cs, cell.Invoke(func(db *statedb.DB, alloc *ipam.Allocator, api *ipam.API,
		allocs statedb.Table[*ipam.Allocation], rules statedb.Table[*ipam.Rule],
		routes statedb.Table[*ipam.Route], cidrs statedb.Table[*ipmasq.CIDR]) {
		a.db, a.alloc, a.api, a.allocs, a.rules, a.routes, a.cidrs = db, alloc, api, allocs, rules, routes, cidrs
	}))
	a.h = infra.New(cs...)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	a.h.RegisterFlags(flags)
	args := append([]string{
		"--state-dir", filepath.Join(dir, "state"),
		"--bpf-root", t.TempDir(),
		"--enable-ip-masq-agent", "--enable-bpf-masquerade",
		"--ip-masq-agent-config-path", filepath.Join(dir, "config", "ip-masq-agent"),
		"--ciliumnode-path", filepath.Join(dir, "node", "ciliumnode.yaml"),
		"--eni-netlink-retry-min=10ms", "--eni-netlink-retry-max=50ms",
	}, extra...)
	if err := flags.Parse(args); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.h.Start(a.log, ctx); err != nil {
		t.Fatalf("hive start: %s", err)
	}
	t.Cleanup(func() {
		if !a.stopped {
			a.h.Stop(a.log, context.Background())
		}
	})
	return a
}

func (a *agent) stop() {
	a.t.Helper()
	a.stopped = true
	if err := a.h.Stop(a.log, context.Background()); err != nil {
		a.t.Fatalf("hive stop: %s", err)
	}
}

// waitFor polls cond every 10ms for up to 10s.
func (a *agent) waitFor(what string, cond func() (bool, string)) {
	a.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("timed out waiting for %s; now:\n%s", what, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (a *agent) waitInitialized() {
	a.t.Helper()
	a.waitFor("tables initialized", func() (bool, string) {
		txn := a.db.ReadTxn()
		for _, tbl := range []interface {
			Initialized(statedb.ReadTxn) (bool, <-chan struct{})
			Name() string
		}{a.allocs, a.rules, a.routes, a.cidrs} {
			if ok, _ := tbl.Initialized(txn); !ok {
				return false, tbl.Name() + " not initialized"
			}
		}
		return true, ""
	})
}

// waitKernel waits until the kernel rules of enimasq's protocol are want
// and every row of eni-rules and eni-routes is Done.
func (a *agent) waitKernel(want string) {
	a.t.Helper()
	a.waitFor("kernel rules and Done rows", func() (bool, string) {
		got, err := ipam.KernelRules(a.nl, []int{unix.AF_INET})
		if err != nil {
			return false, err.Error()
		}
		if got != want {
			return false, got
		}
		txn := a.db.ReadTxn()
		for r := range a.rules.All(txn) {
			if r.Status.Kind != reconciler.StatusKindDone {
				return false, fmt.Sprintf("rule %s: %s %s", r.IPRule(), r.Status.Kind, r.Status.GetError())
			}
		}
		for r := range a.routes.All(txn) {
			if r.Status.Kind != reconciler.StatusKindDone {
				return false, fmt.Sprintf("route %v: %s %s", r.RouteKey, r.Status.Kind, r.Status.GetError())
			}
		}
		return true, ""
	})
}

func (a *agent) allocate(owner, ip string) ipam.AllocationResult {
	a.t.Helper()
	res, _, err := a.alloc.Allocate(ipam.Request{Owner: owner, IP: ip})
	if err != nil {
		a.t.Fatalf("allocate %s %s: %s", owner, ip, err)
	}
	return res
}

// kernelRules is what ipam.KernelRules prints for pods (ip, table), each
// with the given CIDRs ("" for one rule to all destinations).
func kernelRules(cidrs string, pods ...string) string {
	var p20, p111 strings.Builder
	for _, pod := range pods {
		ip, table, _ := strings.Cut(pod, " ")
		fmt.Fprintf(&p20, "20:\tfrom all to %s lookup main\n", ip)
		if cidrs == "" {
			fmt.Fprintf(&p111, "111:\tfrom %s lookup %s\n", ip, table)
		}
		for _, c := range strings.Fields(cidrs) {
			fmt.Fprintf(&p111, "111:\tfrom %s to %s lookup %s\n", ip, c, table)
		}
	}
	return p20.String() + p111.String()
}

var threePods = []string{"10.130.100.133 11", "10.130.100.134 11", "10.130.112.20 12"}

func threePodAgent(t *testing.T, n *testNetNS, nl ipam.Netlink, dir string, extra ...string) *agent {
	a := startAgent(t, n, nl, dir, extra...)
	a.allocate("shop/a", "")
	a.allocate("shop/b", "")
	a.allocate("shop/c", "10.130.112.20")
	a.waitKernel(kernelRules(sampleCIDRs, threePods...))
	return a
}

// Adding a non-masquerade CIDR under running pods adds exactly one rule per
// pod and writes no other row and no other netlink object; removing it
// deletes exactly those.
func TestPrivilegedConfigChangeTouchesOnlyItsRules(t *testing.T) {
	n := newTestNetNS(t, false)
	nl := &countingNetlink{Netlink: n.H}
	dir := newWorkDir(t)
	a := threePodAgent(t, n, nl, dir)

	revisions := func() map[ipam.RuleKey]statedb.Revision {
		m := map[ipam.RuleKey]statedb.Revision{}
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
	writeAtomic(t, filepath.Join(dir, "config", "ip-masq-agent"), peered)
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
	writeAtomic(t, filepath.Join(dir, "config", "ip-masq-agent"), string(sample))
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
	writeAtomic(t, filepath.Join(dir, "node", "ciliumnode.yaml"),
		strings.Replace(string(node), "      10.130.112.20:\n        resource: eni-0a1b2c3d4e5f00002\n", "", 1))
	c := startAgent(t, n, n.H, dir)
	c.waitKernel(kernelRules(sampleCIDRs, threePods[:2]...))
	c.waitFor("10.130.112.20 reported orphaned", func() (bool, string) {
		al, _, _ := c.allocs.Get(c.db.ReadTxn(), ipam.AllocationIPIndex.Query(netip.MustParseAddr("10.130.112.20")))
		return al != nil && al.State == ipam.StateOrphaned, fmt.Sprintf("%+v", al)
	})
	// ENI 2's routes go once its last pod's rows are deleted: the deletes
	// are reconciled after the rules converged, so wait for them too.
	c.waitFor("ENI 2's routes removed", func() (bool, string) {
		routes, err := ipam.KernelRoutes(n.H, []int{unix.AF_INET})
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

// Concurrent requests: every owner gets one IP, no IP goes to two owners,
// the same owner asking twice at once gets the same IP, and the pool runs
// out with ErrPoolExhausted. The checkpoint holds exactly the table.
func TestPrivilegedConcurrentAllocations(t *testing.T) {
	n := newTestNetNS(t, false)
	dir := newWorkDir(t)
	a := startAgent(t, n, n.H, dir)

	const owners = 8
	type answer struct {
		owner string
		ip    string
		err   error
	}
	answers := make(chan answer, 2*owners)
	var wg sync.WaitGroup
	for i := range 2 * owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("ns/pod-%d", i%owners)
			res, _, err := a.alloc.Allocate(ipam.Request{Owner: owner})
			answers <- answer{owner, res.IP, err}
		}()
	}
	wg.Wait()
	close(answers)
	byOwner := map[string]string{}
	byIP := map[string]string{}
	exhausted := map[string]bool{}
	for ans := range answers {
		switch {
		case errors.Is(ans.err, ipam.ErrPoolExhausted):
			exhausted[ans.owner] = true
		case ans.err != nil:
			t.Errorf("%s: %s", ans.owner, ans.err)
		default:
			if prev, ok := byOwner[ans.owner]; ok && prev != ans.ip {
				t.Errorf("%s got %s and %s", ans.owner, prev, ans.ip)
			}
			byOwner[ans.owner] = ans.ip
			if prev, ok := byIP[ans.ip]; ok && prev != ans.owner {
				t.Errorf("%s given to %s and %s", ans.ip, prev, ans.owner)
			}
			byIP[ans.ip] = ans.owner
		}
	}
	if len(byIP) != 5 || len(exhausted) != owners-5 {
		t.Errorf("%d IPs handed out, %d owners refused; want 5 and %d", len(byIP), len(exhausted), owners-5)
	}
	for owner := range exhausted {
		if _, ok := byOwner[owner]; ok {
			t.Errorf("%s got an IP and an exhausted error", owner)
		}
	}
	entries, err := ipam.ReadCheckpoint(filepath.Join(dir, "state", ipam.CheckpointFile))
	if err != nil || len(entries) != 5 {
		t.Fatalf("checkpoint: %v %v", entries, err)
	}
	for _, e := range entries {
		if byIP[e.IP.String()] != e.Owner {
			t.Errorf("checkpoint has %s for %s, table says %s", e.IP, e.Owner, byIP[e.IP.String()])
		}
	}
}

func (a *agent) do(method, path, body string) (int, string) {
	a.t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	a.api.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// The HTTP API: result fields, status codes and JSON errors.
func TestPrivilegedAPI(t *testing.T) {
	n := newTestNetNS(t, false)
	if err := n.DelLink("eni2"); err != nil {
		t.Fatal(err)
	}
	dir := newWorkDir(t)
	a := startAgent(t, n, n.H, dir)

	code, body := a.do("POST", "/v1/ipam?wait=true", `{"owner": "shop/web"}`)
	var res ipam.AllocationResult
	if err := json.Unmarshal([]byte(body), &res); code != http.StatusCreated || err != nil {
		t.Fatalf("POST: %d %s", code, body)
	}
	if res.IP != "10.130.100.133" || res.Gateway != "10.130.96.1" || res.MasterMAC != "0a:58:0a:82:64:0a" ||
		res.InterfaceNumber != "1" || strings.Join(res.CIDRs, " ") != sampleCIDRs {
		t.Errorf("result %+v", res)
	}
	for _, field := range []string{`"ip"`, `"gateway"`, `"cidrs"`, `"master-mac"`, `"interface-number"`} {
		if !strings.Contains(body, field) {
			t.Errorf("result has no %s field: %s", field, body)
		}
	}
	// ?wait=true answered after the rules were in the kernel.
	rules, _ := ipam.KernelRules(n.H, []int{unix.AF_INET})
	if rules != kernelRules(sampleCIDRs, "10.130.100.133 11") {
		t.Errorf("rules after POST ?wait=true:\n%s", rules)
	}
	if code, again := a.do("POST", "/v1/ipam", `{"owner": "shop/web"}`); code != http.StatusOK || again != body {
		t.Errorf("POST again: %d %s", code, again)
	}

	for _, tc := range []struct {
		method, path, body string
		code               int
		reason, message    string
	}{
		{"POST", "/v1/ipam", `{"owner": "shop/web"`, 400, "invalid-request", "body"},
		{"POST", "/v1/ipam", `{"owner": "shop/x", "pod": "x"}`, 400, "invalid-request", `unknown field "pod"`},
		{"POST", "/v1/ipam", `{"owner": "x"}`, 400, "invalid-request", "NAMESPACE/POD"},
		{"POST", "/v1/ipam?wait=maybe", `{"owner": "shop/x"}`, 400, "invalid-request", "wait"},
		{"POST", "/v1/ipam", `{"owner": "shop/x", "family": "ipv6"}`, 400, "invalid-request", "IPv6 is disabled"},
		{"POST", "/v1/ipam", `{"owner": "shop/x", "ip": "10.130.100.133"}`, 409, "ip-in-use", "held by shop/web"},
		{"POST", "/v1/ipam", `{"owner": "shop/web", "ip": "10.130.100.134"}`, 409, "owner-has-ip", "holds 10.130.100.133"},
		{"POST", "/v1/ipam", `{"owner": "shop/x", "ip": "10.130.0.10"}`, 404, "not-in-pool", "not in spec.ipam.pool"},
		{"DELETE", "/v1/ipam/10.130.100.200", "", 404, "unknown-ip", "not allocated"},
		{"DELETE", "/v1/ipam/nope", "", 400, "invalid-request", "not an IP address"},
		{"GET", "/v1/ipam/10.130.100.200", "", 404, "unknown-ip", "not allocated"},
		// ENI 2's link is missing: the allocation stands, the answer says
		// why the pod's egress is not ready.
		{"POST", "/v1/ipam?wait=true&timeout=300ms", `{"owner": "shop/c", "ip": "10.130.112.20"}`, 503, "rules-failed", "no link with MAC 0a:58:0a:82:70:0a"},
	} {
		code, body := a.do(tc.method, tc.path, tc.body)
		var e ipam.APIError
		if err := json.Unmarshal([]byte(body), &e); err != nil || code != tc.code || e.Reason != tc.reason || !strings.Contains(e.Message, tc.message) {
			t.Errorf("%s %s %s: %d %s; want %d, reason %s, error containing %q", tc.method, tc.path, tc.body, code, body, tc.code, tc.reason, tc.message)
		}
		if tc.reason == "rules-failed" && (e.Result == nil || e.Result.IP != "10.130.112.20") {
			t.Errorf("rules-failed without the result: %s", body)
		}
	}

	for _, owner := range []string{"shop/b", "shop/d", "shop/e"} {
		if code, body := a.do("POST", "/v1/ipam", `{"owner": "`+owner+`"}`); code != http.StatusCreated {
			t.Fatalf("POST %s: %d %s", owner, code, body)
		}
	}
	if code, body := a.do("POST", "/v1/ipam", `{"owner": "shop/f"}`); code != http.StatusServiceUnavailable || !strings.Contains(body, `"pool-exhausted"`) {
		t.Errorf("exhausted: %d %s", code, body)
	}

	code, body = a.do("GET", "/v1/ipam", "")
	var list []ipam.AllocationInfo
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || len(list) != 5 ||
		list[0] != (ipam.AllocationInfo{IP: "10.130.100.133", Owner: "shop/web", Family: "ipv4", ENI: "eni-0a1b2c3d4e5f00001", State: "Allocated"}) {
		t.Errorf("GET /v1/ipam: %d %s", code, body)
	}
	if code, body := a.do("GET", "/v1/ipam/10.130.100.133", ""); code != 200 || !strings.Contains(body, `"master-mac": "0a:58:0a:82:64:0a"`) {
		t.Errorf("GET /v1/ipam/10.130.100.133: %d %s", code, body)
	}
	if code, body := a.do("DELETE", "/v1/ipam/10.130.100.133", ""); code != 200 || !strings.Contains(body, `"owner": "shop/web"`) {
		t.Errorf("DELETE: %d %s", code, body)
	}
	a.waitFor("the released pod's rules gone", func() (bool, string) {
		rules, _ := ipam.KernelRules(n.H, []int{unix.AF_INET})
		return !strings.Contains(rules, "10.130.100.133"), rules
	})
}

// Before the CiliumNode is read, the API answers 503 not-ready.
func TestPrivilegedAPINotReady(t *testing.T) {
	n := newTestNetNS(t, false)
	dir := newWorkDir(t)
	os.Remove(filepath.Join(dir, "node", "ciliumnode.yaml"))
	a := startAgentNoWait(t, n, n.H, dir)
	code, body := a.do("POST", "/v1/ipam", `{"owner": "shop/web"}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"not-ready"`) {
		t.Errorf("POST before the CiliumNode: %d %s", code, body)
	}
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
		got, err := ipam.KernelRules(n.H, []int{unix.AF_INET})
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
