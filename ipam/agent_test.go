package ipam_test

// A started hive of the cells under test on a testNetwork (a netlinkfake.Netlink or
// a network namespace), for the Go tests that script tests cannot express:
// restarts, concurrency, the HTTP API, operation counts.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/infra"
	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/allocator"
	"github.com/enimasq/enimasq/ipam/datapath"
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
	nl     datapath.Netlink
	db     *statedb.DB
	alloc  *allocator.Allocator
	api    *allocator.API
	allocs statedb.Table[*allocations.Allocation]
	rules  statedb.Table[*datapath.Rule]
	routes statedb.Table[*datapath.Route]
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
		celltest.WriteFileAtomic(t, filepath.Join(dir, f.dst), string(data))
	}
	return dir
}

// startAgent starts a hive in the namespace with the files of dir and waits
// until its tables are initialized.
func startAgent(t testing.TB, n testNetwork, nl datapath.Netlink, dir string, extra ...string) *agent {
	t.Helper()
	a := startAgentNoWait(t, n, nl, dir, extra...)
	a.waitInitialized()
	return a
}

func startAgentNoWait(t testing.TB, n testNetwork, nl datapath.Netlink, dir string, extra ...string) *agent {
	t.Helper()
	a := &agent{t: t, nl: nl, log: hivetest.Logger(t, hivetest.LogLevel(slog.LevelInfo))}
	cs := append([]cell.Cell{infra.Core, infra.NodeConfigCell}, testCells(n, nl)...)
	cs = append(cs, cell.Invoke(func(db *statedb.DB, alloc *allocator.Allocator, api *allocator.API,
		allocs statedb.Table[*allocations.Allocation], rules statedb.Table[*datapath.Rule],
		routes statedb.Table[*datapath.Route], cidrs statedb.Table[*ipmasq.CIDR]) {
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
		got, err := datapath.KernelRules(a.nl, []int{unix.AF_INET})
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

func (a *agent) allocate(owner, ip string) allocator.AllocationResult {
	a.t.Helper()
	res, _, err := a.alloc.Allocate(allocator.Request{Owner: owner, IP: ip})
	if err != nil {
		a.t.Fatalf("allocate %s %s: %s", owner, ip, err)
	}
	return res
}

// kernelRules is what datapath.KernelRules prints for pods (ip, table), each
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

func threePodAgent(t *testing.T, n testNetwork, nl datapath.Netlink, dir string, extra ...string) *agent {
	a := startAgent(t, n, nl, dir, extra...)
	a.allocate("shop/a", "")
	a.allocate("shop/b", "")
	a.allocate("shop/c", "10.130.112.20")
	a.waitKernel(kernelRules(sampleCIDRs, threePods...))
	return a
}
