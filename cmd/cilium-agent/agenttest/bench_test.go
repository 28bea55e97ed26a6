package agenttest

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
)

// What enimasq costs inside Cilium's agent, measured on the whole agent in
// the simulated instance of TestPrivilegedCiliumAgent:
//
//   - rss-*: the agent's resident set at rest (Cilium Ok, router and health
//     endpoint, 10 s idle, median of five readings a second apart), built
//     with enimasq's cells and without (Cilium's own daemon/main.go, same
//     module versions, same flags but enimasq's, same instance);
//   - edit-*: with 100 pods added by cilium-cni, the time from an
//     ip-masq-agent edit (one CIDR removed, two added) to every IP's egress
//     rules being exactly the new set, median of 6 edits; the floor is the
//     kernel's share of the same work, the rule deletes and adds of one edit
//     done by hand with netlink in a namespace holding as many rules.
//
// The measurement is long (two agent starts, 100 CNI ADDs) and is made once;
// a second call of the function with a larger b.N reports the same figures.
func BenchmarkCiliumAgent(b *testing.B) {
	benchOnce.Do(func() { benchFigures = measureCiliumAgent(b) })
	if benchFigures == nil {
		b.Fatal("the measurement failed")
	}
	for b.Loop() {
	}
	for _, f := range benchFigures {
		b.ReportMetric(f.value, f.unit)
	}
}

var (
	benchOnce    sync.Once
	benchFigures []figure
)

type figure struct {
	value float64
	unit  string
}

const benchPods = 100

func measureCiliumAgent(b *testing.B) []figure {
	e := newEnv(b)
	if !fileExists(e.bins.upstream) {
		b.Fatalf("%s is missing: run make cilium-agent", e.bins.upstream)
	}
	configA := []string{"10.0.0.0/8", "192.168.0.0/16"}
	configB := []string{"10.0.0.0/8", "172.16.0.0/12", "100.64.0.0/10"}

	rssAtRest := func(binary string) float64 {
		bpfRoot := celltest.MountBPFFS(b)
		// On a node the bpffs holds tc/globals before the agent starts
		// (Cilium's init container, earlier runs). Upstream's agent pins
		// its metrics map in a start hook, before it makes the directory:
		// on a bare bpffs it fails ("pin map to .../tc/globals/cilium_metrics:
		// no such file or directory"). enimasq's cells make the directory
		// themselves.
		if err := os.MkdirAll(filepath.Join(bpfRoot, "tc", "globals"), 0o755); err != nil {
			b.Fatal(err)
		}
		a := newAgent(b, e.bins, e.node, e.cluster, bpfRoot, e.libDir)
		a.binary = binary
		a.writeConfig(configA...)
		a.start()
		time.Sleep(10 * time.Second) // at rest: what is measured is idleness
		var samples []float64
		for range 5 {
			samples = append(samples, float64(celltest.ProcMemory(b, a.cmd.Process.Pid, "VmRSS"))/(1<<20))
			time.Sleep(time.Second)
		}
		a.stop()
		slices.Sort(samples)
		return samples[len(samples)/2]
	}
	upstream := rssAtRest(e.bins.upstream)
	withEnimasq := rssAtRest(e.bins.agent)
	b.Logf("RSS at rest: %.0f MB with enimasq's cells, %.0f MB without (%.2fx)", withEnimasq, upstream, withEnimasq/upstream)

	a := newAgent(b, e.bins, e.node, e.cluster, celltest.MountBPFFS(b), e.libDir)
	a.writeConfig(configA...)
	a.start()
	var pods []netip.Addr
	start := time.Now()
	for i := range benchPods {
		p := newPod(b, e.cluster, "shop", fmt.Sprintf("cart-%d", i))
		a.cniAdd(p)
		pods = append(pods, p.ip)
	}
	b.Logf("%d pods added with cilium-cni in %s", benchPods, time.Since(start).Round(time.Second))
	a.waitFor("the pods' rules", time.Minute, egressRulesAre(a, e.node, configA, pods...))
	ips, err := ciliumIPs(a, e.node)
	if err != nil {
		b.Fatal(err)
	}

	var edits []time.Duration
	for i := range 6 {
		config := configB
		if i%2 == 1 {
			config = configA
		}
		ready := exactRules(b, e.node, ips, config)
		a.writeConfig(config...)
		edits = append(edits, a.waitFor("every IP's rules after the edit", 10*time.Second, ready))
	}
	slices.Sort(edits)
	edit := edits[len(edits)/2]
	a.stop()

	floor := ruleFloor(b, ips, desiredCIDRs(configA), desiredCIDRs(configB))
	b.Logf("edit to the rules of %d IPs: %s (median of %v); floor %s", len(ips), edit, edits, floor)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return []figure{
		{withEnimasq, "rss-enimasq-MB"},
		{upstream, "rss-upstream-MB"},
		{withEnimasq / upstream, "rss-ratio"},
		{ms(edit), "edit-100ep-ms"},
		{ms(floor), "edit-floor-ms"},
		{float64(edit) / float64(floor), "edit/floor"},
	}
}

// ruleFloor is the kernel's time for the rule changes of one edit from
// cidrs before to after, for ips: the deletes and adds by hand, in a fresh
// namespace that holds the rules of before (median of 5 runs each way).
func ruleFloor(b *testing.B, ips []netip.Addr, before, after []netip.Prefix) time.Duration {
	ns := celltest.NewNetNS(b)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	rule := func(ip netip.Addr, to netip.Prefix) *netlink.Rule {
		r := netlink.NewRule()
		r.Priority, r.Family, r.Table, r.Protocol = 111, unix.AF_INET, eni1.routeTable(), unix.RTPROT_KERNEL
		r.Src, r.Dst = ipNet(netip.PrefixFrom(ip, 32)), ipNet(to)
		return r
	}
	for _, ip := range ips {
		for _, c := range before {
			if err := h.RuleAdd(rule(ip, c)); err != nil {
				b.Fatal(err)
			}
		}
	}
	apply := func(from, to []netip.Prefix) time.Duration {
		start := time.Now()
		for _, ip := range ips {
			for _, c := range from {
				if !slices.Contains(to, c) {
					if err := h.RuleDel(rule(ip, c)); err != nil {
						b.Fatal(err)
					}
				}
			}
			for _, c := range to {
				if !slices.Contains(from, c) {
					if err := h.RuleAdd(rule(ip, c)); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
		return time.Since(start)
	}
	var runs []time.Duration
	for range 5 {
		runs = append(runs, apply(before, after), apply(after, before))
	}
	slices.Sort(runs)
	return runs[len(runs)/2]
}
