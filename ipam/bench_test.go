package ipam_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/infra"
	"github.com/enimasq/enimasq/cells/kernel"
	"github.com/enimasq/enimasq/ipam"
	"github.com/enimasq/enimasq/ipam/allocator"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipam/datapath"
	"github.com/enimasq/enimasq/ipmasq"
)

const (
	benchPods  = 500
	benchTable = 11
)

// benchCiliumNode has two ENIs with 250 pool IPs each.
func benchCiliumNode() string {
	var b strings.Builder
	b.WriteString("spec:\n  eni: {first-interface-index: 1}\n  ipam:\n    pool:\n")
	for i := range benchPods {
		eni, third := 1, 100+i/250
		if i >= 250 {
			eni, third = 2, 113+(i-250)/250 // 10.130.112.1 is the gateway
		}
		fmt.Fprintf(&b, "      10.130.%d.%d: {resource: eni-%d}\n", third, 1+i%250, eni)
	}
	b.WriteString(`status:
  eni:
    enis:
      eni-1: {mac: "0a:58:0a:82:64:0a", number: 1, subnet: {cidr: 10.130.96.0/20}, vpc: {primary-cidr: 10.128.0.0/13, cidrs: [100.112.0.0/13]}}
      eni-2: {mac: "0a:58:0a:82:70:0a", number: 2, subnet: {cidr: 10.130.112.0/20}, vpc: {primary-cidr: 10.128.0.0/13, cidrs: [100.112.0.0/13]}}
`)
	return b.String()
}

// benchCIDRs are 8 CIDRs per pod once the VPC CIDRs are coalesced into
// 10.0.0.0/8 and 100.64.0.0/10.
var benchCIDRs = []string{
	"10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16",
	"192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24",
}

var benchNewCIDR = netip.MustParsePrefix("198.18.0.0/15")

type benchEnv struct {
	// config is the ip-masq-agent file when the CIDRs come from it (the
	// ipmasq cell's watcher in the timed path); "" when the benchmark
	// writes the table itself.
	config string
	n      *testNetNS
	nl     *countingNetlink
	db     *statedb.DB
	cidrs  statedb.RWTable[*ipmasq.CIDR]
	rules  statedb.Table[*datapath.Rule]
	alloc  *allocator.Allocator
	pods   []netip.Addr
	tables map[netip.Addr]int
}

func (e *benchEnv) setCIDRs(b *testing.B, extra ...netip.Prefix) {
	if e.config != "" {
		var f strings.Builder
		f.WriteString("nonMasqueradeCIDRs:\n")
		for _, c := range benchCIDRs {
			fmt.Fprintf(&f, "- %s\n", c)
		}
		for _, p := range extra {
			fmt.Fprintf(&f, "- %s\n", p)
		}
		f.WriteString("masqLinkLocal: true\n")
		celltest.WriteFileAtomic(b, e.config, f.String())
		return
	}
	var rows []ipmasq.CIDR
	for _, s := range benchCIDRs {
		rows = append(rows, ipmasq.CIDR{Prefix: netip.MustParsePrefix(s), Source: ipmasq.SourceConfig})
	}
	for _, p := range extra {
		rows = append(rows, ipmasq.CIDR{Prefix: p, Source: ipmasq.SourceConfig})
	}
	wtxn := e.db.WriteTxn(e.cidrs)
	ipmasq.Diff(wtxn, e.cidrs, rows)
	wtxn.Commit()
}

// waitRules waits until eni-rules has want rows to dst (all Done) and
// total rows in all, all Done.
func (e *benchEnv) waitRules(b *testing.B, dst netip.Prefix, want, total int) {
	deadline := time.After(60 * time.Second)
	for {
		rows, watch := e.rules.AllWatch(e.db.ReadTxn())
		n, all, done := 0, 0, true
		for r := range rows {
			all++
			if r.Status.Kind != reconciler.StatusKindDone {
				done = false
				break
			}
			if r.To == dst {
				n++
			}
		}
		if done && n == want && all == total {
			return
		}
		select {
		case <-watch:
		case <-deadline:
			b.Fatalf("timed out: %d rules to %s, %d rows", n, dst, all)
		}
	}
}

// newBenchEnv starts the ipam cell in a fresh netns with pods running pods,
// each with benchCIDRs' rules in the kernel. With fromFile the CIDRs come
// from an ip-masq-agent file through the ipmasq cell (the path a user's
// edit takes); without, the benchmark writes ip-masq-agent-cidrs itself.
func newBenchEnv(b *testing.B, pods int, fromFile bool) *benchEnv {
	n := newTestNetNS(b, false)
	e := &benchEnv{n: n, nl: &countingNetlink{Netlink: n.H}, tables: map[netip.Addr]int{}}
	dir := b.TempDir()
	celltest.WriteFileAtomic(b, filepath.Join(dir, "ciliumnode.yaml"), benchCiliumNode())
	args := []string{
		"--state-dir", filepath.Join(dir, "state"), "--bpf-root", dir,
		"--enable-bpf-masquerade", "--ciliumnode-path", filepath.Join(dir, "ciliumnode.yaml"),
	}

	var initCIDRs func(statedb.WriteTxn)
	cidrsCell := cell.Provide(func(db *statedb.DB) (statedb.RWTable[*ipmasq.CIDR], statedb.Table[*ipmasq.CIDR], error) {
		// The ip-masq-agent-cidrs table, written by the benchmark itself:
		// no file watcher in the timed path.
		tbl, err := ipmasq.NewTable(db)
		if err != nil {
			return nil, nil, err
		}
		wtxn := db.WriteTxn(tbl)
		initCIDRs = tbl.RegisterInitializer(wtxn, "bench")
		wtxn.Commit()
		e.cidrs = tbl
		return tbl, tbl, nil
	})
	if fromFile {
		e.config = filepath.Join(dir, "config", "ip-masq-agent")
		e.setCIDRs(b)
		cidrsCell = ipmasq.Cell
		args = append(args, "--enable-ip-masq-agent", "--ip-masq-agent-config-path", e.config)
	}
	h := infra.New(
		infra.Core, infra.NodeConfigCell,
		cidrsCell,
		ipam.Cell,
		cell.Provide(func() *datapath.NetlinkTarget { return &datapath.NetlinkTarget{Handle: e.nl} }),
		kernel.Cell,
		n.KernelCell(),
		cell.Invoke(func(db *statedb.DB, rules statedb.Table[*datapath.Rule], alloc *allocator.Allocator) {
			e.db, e.rules, e.alloc = db, rules, alloc
		}),
	)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	if err := flags.Parse(args); err != nil {
		b.Fatal(err)
	}
	log := hivetest.Logger(b, hivetest.LogLevel(slog.LevelWarn))
	if err := h.Start(log, context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Stop(log, context.Background()) })

	if !fromFile {
		e.setCIDRs(b)
		wtxn := e.db.WriteTxn(e.cidrs)
		initCIDRs(wtxn)
		wtxn.Commit()
	}

	deadline := time.Now().Add(30 * time.Second)
	for i := range pods {
		for {
			res, _, err := e.alloc.Allocate(allocator.Request{Owner: fmt.Sprintf("bench/pod-%d", i)})
			if err == nil {
				ip := netip.MustParseAddr(res.IP)
				e.pods = append(e.pods, ip)
				e.tables[ip] = 10 + int(res.InterfaceNumber[0]-'0')
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("allocate: %s", err)
			}
			time.Sleep(10 * time.Millisecond) // CiliumNode or checkpoint not read yet
		}
	}
	e.waitRules(b, netip.Prefix{}, 0, pods*(1+len(benchCIDRs)))
	return e
}

func egressRule(pod netip.Addr, dst netip.Prefix, table int) *netlink.Rule {
	r := netlink.NewRule()
	r.Priority = datapath.RulePriorityEgress
	r.Family = 2 // AF_INET
	r.Table = table
	r.Protocol = datapath.RTProto
	r.Src = ipNetOf(netip.PrefixFrom(pod, 32))
	r.Dst = ipNetOf(dst)
	return r
}

// BenchmarkAddCIDR500Pods: 500 pods with 8 CIDRs each (4000 egress rules
// plus 500 priority-20 rules in the kernel); one non-masquerade CIDR is
// added to ip-masq-agent-cidrs. It must cost exactly 500 rule additions and
// nothing else. Reported:
//
//	floor-ms      a raw netlink loop of the same 500 additions, same run
//	x-floor       the cell's time (table write until all 500 rows Done) / floor
//	rebuild-x-floor  re-running every pod's setup (delete its 8 egress
//	              rules, add its 9) / floor: what Cilium needs to apply it
//	x-rebuild     the cell's time / the rebuild's
func BenchmarkAddCIDR500Pods(b *testing.B) { benchAddCIDR(b, benchPods, false) }

// BenchmarkFileEditRules100Pods is the path a user's edit takes: one CIDR
// added to the ip-masq-agent file (written as a ConfigMap update or an
// editor does, by rename), until the kernel holds the new rule of each of
// 100 running pods and every row is Done: the file watch, the parse, the
// table diff, the derive and the netlink reconciler. Same figures as
// BenchmarkAddCIDR500Pods.
func BenchmarkFileEditRules100Pods(b *testing.B) { benchAddCIDR(b, 100, true) }

func benchAddCIDR(b *testing.B, pods int, fromFile bool) {
	celltest.RequireRoot(b)
	e := newBenchEnv(b, pods, fromFile)
	total := pods * (1 + len(benchCIDRs))
	oldCIDRs := ciliumnode.CoalesceCIDRs(parsePrefixes(benchCIDRs))
	if len(oldCIDRs) != 8 {
		b.Fatalf("%d CIDRs per pod, want 8", len(oldCIDRs))
	}

	var floor, ours, rebuild time.Duration
	for b.Loop() {
		b.StopTimer()
		// Floor: the same 500 additions, raw.
		start := time.Now()
		for _, pod := range e.pods {
			if err := e.n.H.RuleAdd(egressRule(pod, benchNewCIDR, e.tables[pod])); err != nil {
				b.Fatal(err)
			}
		}
		floor += time.Since(start)
		for _, pod := range e.pods {
			if err := e.n.H.RuleDel(egressRule(pod, benchNewCIDR, e.tables[pod])); err != nil {
				b.Fatal(err)
			}
		}

		// The cell: one row in ip-masq-agent-cidrs.
		adds, dels := e.nl.ruleAdds.Load(), e.nl.ruleDels.Load()
		routes := e.nl.routeReplaces.Load() + e.nl.routeDels.Load()
		b.StartTimer()
		start = time.Now()
		e.setCIDRs(b, benchNewCIDR)
		e.waitRules(b, benchNewCIDR, pods, total+pods)
		ours += time.Since(start)
		b.StopTimer()
		if got := e.nl.ruleAdds.Load() - adds; got != int64(pods) {
			b.Fatalf("%d rule additions, want exactly %d", got, pods)
		}
		if got := e.nl.ruleDels.Load() - dels; got != 0 {
			b.Fatalf("%d rule deletions, want 0", got)
		}
		if got := e.nl.routeReplaces.Load() + e.nl.routeDels.Load() - routes; got != 0 {
			b.Fatalf("%d route operations, want 0", got)
		}
		b.ReportMetric(float64(pods), "rule-adds")
		dels = e.nl.ruleDels.Load()
		e.setCIDRs(b)
		e.waitRules(b, benchNewCIDR, 0, total)
		for e.nl.ruleDels.Load()-dels < int64(pods) {
			time.Sleep(time.Millisecond) // the kernel deletions follow the rows'
		}

		// Rebuild: every pod's egress rules deleted and added again with
		// the new CIDR, as re-running pod setup would.
		newCIDRs := append(oldCIDRs[:len(oldCIDRs):len(oldCIDRs)], benchNewCIDR)
		start = time.Now()
		for _, pod := range e.pods {
			for _, c := range oldCIDRs {
				if err := e.n.H.RuleDel(egressRule(pod, c, e.tables[pod])); err != nil {
					b.Fatal(err)
				}
			}
			for _, c := range newCIDRs {
				if err := e.n.H.RuleAdd(egressRule(pod, c, e.tables[pod])); err != nil {
					b.Fatal(err)
				}
			}
		}
		rebuild += time.Since(start)
		for _, pod := range e.pods {
			if err := e.n.H.RuleDel(egressRule(pod, benchNewCIDR, e.tables[pod])); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(floor.Microseconds())/float64(b.N)/1000, "floor-ms")
	b.ReportMetric(float64(ours)/float64(floor), "x-floor")
	b.ReportMetric(float64(rebuild)/float64(floor), "rebuild-x-floor")
	b.ReportMetric(float64(ours)/float64(rebuild), "x-rebuild")
}

func parsePrefixes(ss []string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}
