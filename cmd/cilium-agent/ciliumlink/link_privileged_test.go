package ciliumlink_test

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	awsTypes "github.com/cilium/cilium/pkg/aws/types"
	linuxrouting "github.com/cilium/cilium/pkg/datapath/linux/routing"
	"github.com/cilium/cilium/pkg/hive"
	"github.com/cilium/cilium/pkg/ip"
	ipamTypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumipmasq "github.com/cilium/cilium/pkg/ipmasq"
	ipmasqcell "github.com/cilium/cilium/pkg/ipmasq/cell"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	"github.com/cilium/cilium/pkg/k8s/client/testutils"
	ipmasqmaps "github.com/cilium/cilium/pkg/maps/ipmasq"
	"github.com/cilium/cilium/pkg/metrics/metric"
	nodeTypes "github.com/cilium/cilium/pkg/node/types"
	"github.com/cilium/cilium/pkg/option"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cmd/cilium-agent/ciliumlink"
	"github.com/enimasq/enimasq/ipam"
	"github.com/enimasq/enimasq/ipmasq"
	"github.com/enimasq/enimasq/policymap/masqmap"
)

// An ENI of the test node: a veth in the test's network namespace stands in
// for the ENI's link (found by MAC, as Cilium and enimasq both do).
type testENI struct {
	id     string
	number int
	mac    string
	subnet netip.Prefix
}

func (e testENI) gateway() netip.Addr { return e.subnet.Addr().Next() }

var (
	vpc   = netip.MustParsePrefix("172.31.0.0/16")
	eni0  = testENI{"eni-0", 0, "0a:00:00:00:00:10", netip.MustParsePrefix("172.31.0.0/20")}
	eni1  = testENI{"eni-1", 1, "0a:00:00:00:00:11", netip.MustParsePrefix("172.31.16.0/20")}
	eni2  = testENI{"eni-2", 2, "0a:00:00:00:00:12", netip.MustParsePrefix("172.31.32.0/20")}
	podA  = netip.MustParseAddr("172.31.16.10")
	podB  = netip.MustParseAddr("172.31.16.11")
	podC  = netip.MustParseAddr("172.31.32.10")
	podD  = netip.MustParseAddr("172.31.16.99") // created by cilium-cni, not in status.ipam.used yet
	podOf = map[netip.Addr]testENI{podA: eni1, podB: eni1, podC: eni2, podD: eni1}
)

// TestPrivilegedLinkedIntoCilium runs enimasq's cells with ciliumlink in a
// hive of Cilium's own cells (its hive with statedb, jobs and health, its
// fake clientset, its ip-masq-agent cell), in a fresh network namespace
// with a private bpffs, and shows:
//
//   - a CiliumNode created through Cilium's clientset reaches the enis table;
//   - the ip-masq-agent file becomes cilium_ipmasq_v4, written by enimasq
//     alone (Cilium's writer is off; Cilium's IPAM reads the file through a
//     map-less agent);
//   - the pod rules that Cilium's own RoutingInfo.Configure wrote (called as
//     cilium-cni calls it at ADD) follow a config edit that removes one CIDR
//     and adds another, while rules of other priorities, and of a pod the
//     CiliumNode does not list yet, are untouched.
func TestPrivilegedLinkedIntoCilium(t *testing.T) {
	celltest.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := hivetest.Logger(t, hivetest.LogLevel(slog.LevelInfo))

	ns := celltest.NewNetNS(t)
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nl.Close() })
	for _, e := range []testENI{eni0, eni1, eni2} {
		addENILink(t, nl, e)
	}
	bpfRoot := celltest.MountBPFFS(t)

	dir := t.TempDir()
	configPath := filepath.Join(dir, "ip-masq-agent", "config")
	writeFile(t, configPath, "nonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16]\n")

	nodeTypes.SetName("ip-172-31-16-5.ec2.internal")
	dc := &option.DaemonConfig{
		EnableIPv4:           true,
		EnableBPFMasquerade:  true,
		EnableIPv4Masquerade: true,
		EnableIPMasqAgent:    true, // what --enable-ip-masq-agent sets in Cilium
		IPAM:                 "eni",
		BPFRoot:              bpfRoot,
		StateDir:             filepath.Join(dir, "cilium-state"),
	}

	var (
		db        *statedb.DB
		enis      statedb.Table[*ipam.ENI]
		rules     statedb.Table[*ipam.Rule]
		cidrs     statedb.Table[*ipmasq.CIDR]
		masq      statedb.Table[*masqmap.Entry]
		fcs       *testutils.FakeClientset
		ipmasqAg  *ciliumipmasq.IPMasqAgent
		ipmasqCfg ipmasqcell.Config
		hiveMets  []metric.WithMetadata
	)
	h := hive.New(
		testutils.FakeClientCell(),
		// Cilium's own ip-masq-agent cell, with its flags. Its map is never
		// written: ciliumlink turns its writer off.
		ipmasqcell.Cell,
		cell.Provide(
			func() *ipmasqmaps.IPMasqBPFMap { return &ipmasqmaps.IPMasqBPFMap{} },
			func() *option.DaemonConfig { return dc },
			func() *ipam.NetlinkTarget { return &ipam.NetlinkTarget{Handle: nl, NS: &ns} },
		),
		ciliumlink.Cell,
		cell.Invoke(func(d *statedb.DB, e statedb.Table[*ipam.ENI], r statedb.Table[*ipam.Rule],
			c statedb.Table[*ipmasq.CIDR], m statedb.Table[*masqmap.Entry], f *testutils.FakeClientset,
			a *ciliumipmasq.IPMasqAgent, ic ipmasqcell.Config, hm hiveMetrics) {
			db, enis, rules, cidrs, masq, fcs, ipmasqAg, ipmasqCfg, hiveMets = d, e, r, c, m, f, a, ic, hm.Metrics
		}),
	)
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	if err := flags.Parse([]string{"--enable-ip-masq-agent", "--ip-masq-agent-config-path", configPath}); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(log, ctx); err != nil {
		t.Fatalf("start: %s", err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Errorf("stop: %s", err)
		}
	})

	// Cilium's writer is off, and Cilium's IPAM gets an agent that reads
	// the file (the CIDRs of a new pod at ADD).
	if ipmasqCfg.EnableIPMasqAgent {
		t.Fatal("Cilium's ip-masq-agent writer is on: two writers of cilium_ipmasq_v4")
	}
	if ipmasqAg == nil {
		t.Fatal("no *ipmasq.IPMasqAgent: Cilium's ENI IPAM would dereference nil")
	}
	nonMasq := ipmasqAg.NonMasqCIDRsFromConfig()

	// cilium-cni ADD for pods A, B, C and D, with the CIDRs Cilium's ENI
	// IPAM returns (VPC CIDR plus the non-masquerade CIDRs).
	for _, pod := range []netip.Addr{podA, podB, podC, podD} {
		cniAdd(t, log, ns, pod, podOf[pod], append([]netip.Prefix{vpc}, nonMasq...))
	}
	// Rules enimasq must not touch: another priority, and the kernel's own.
	other := netlink.NewRule()
	other.Priority, other.Family, other.Table, other.Protocol = 110, unix.AF_INET, 11, unix.RTPROT_KERNEL
	other.Src, other.Dst = ipNet(netip.PrefixFrom(podA, 32)), ipNet(netip.MustParsePrefix("8.8.8.0/24"))
	if err := nl.RuleAdd(other); err != nil {
		t.Fatal(err)
	}
	before := listRules(t, nl)

	// The CiliumNode, created through Cilium's clientset as Cilium's
	// operator and IPAM write it (pods A, B, C in status.ipam.used).
	createCiliumNode(t, ctx, fcs)
	waitFor(t, ctx, db, "eni-1 in the enis table", func(txn statedb.ReadTxn) (bool, <-chan struct{}) {
		e, _, w, found := enis.GetWatch(txn, ipam.ENIIDIndex.Query("eni-1"))
		return found && e.Number == 1 && len(e.Used) == 2, w
	})

	wantCIDRs := func(set ...string) {
		t.Helper()
		var want []netip.Prefix
		for _, s := range set {
			want = append(want, netip.MustParsePrefix(s))
		}
		slices.SortFunc(want, netip.Prefix.Compare)
		// The table, the reconciler and the map agree.
		waitFor(t, ctx, db, "ip-masq-agent-cidrs and masq-map-entries", func(txn statedb.ReadTxn) (bool, <-chan struct{}) {
			var got []netip.Prefix
			it, w := cidrs.AllWatch(txn)
			for c := range it {
				if c.Prefix.Addr().Is4() { // fe80::/10 is there too, skipped: IPv4-only node
					got = append(got, c.Prefix)
				}
			}
			if !slices.Equal(got, want) {
				return false, w
			}
			entries, mw := masq.AllWatch(txn)
			n := 0
			for e := range entries {
				if e.Skipped != "" {
					continue
				}
				if e.Status.Kind != reconciler.StatusKindDone {
					return false, mw
				}
				n++
			}
			return n == len(want), mw
		})
		if got := dumpIPMasqV4(t, bpfRoot); !slices.Equal(got, want) {
			t.Errorf("cilium_ipmasq_v4 = %v, want the table %v", got, want)
		}
	}
	// egressRules waits until eni-rules holds, all Done, exactly the egress
	// rules of pods to the CIDRs cidrs (not merely as many rows: the rows of
	// the previous state are Done too), then reads the kernel: each pod's
	// priority-111 destinations.
	egressRules := func(pods []netip.Addr, cidrs ...string) map[netip.Addr][]netip.Prefix {
		t.Helper()
		want := map[ipam.RuleKey]bool{}
		for _, pod := range pods {
			for _, c := range prefixes(cidrs...) {
				want[ipam.RuleKey{Priority: 111, From: netip.PrefixFrom(pod, 32), To: c, Table: 10 + podOf[pod].number}] = true
			}
		}
		waitFor(t, ctx, db, "eni-rules Done", func(txn statedb.ReadTxn) (bool, <-chan struct{}) {
			it, w := rules.AllWatch(txn)
			count := 0
			for r := range it {
				if r.Status.Kind != reconciler.StatusKindDone || !want[r.RuleKey] {
					return false, w
				}
				count++
			}
			return count == len(want), w
		})
		out := map[netip.Addr][]netip.Prefix{}
		for _, r := range listRules(t, nl) {
			if r.Priority != 111 || r.Src == nil {
				continue
			}
			src, _ := netip.AddrFromSlice(r.Src.IP)
			if r.Table != 10+podOf[src].number {
				t.Errorf("rule %s: table %d, want %d", r, r.Table, 10+podOf[src].number)
			}
			out[src] = append(out[src], prefixOf(r.Dst))
		}
		for _, ps := range out {
			slices.SortFunc(ps, netip.Prefix.Compare)
		}
		return out
	}

	wantCIDRs("10.0.0.0/8", "169.254.0.0/16", "192.168.0.0/16")
	// enimasq's metrics reach Cilium's registry as one hive metric.
	if v := gatherEnimasq(t, hiveMets, "enimasq_bpf_map_entries", "cilium_ipmasq_v4"); v != 3 {
		t.Errorf("enimasq_bpf_map_entries{map=cilium_ipmasq_v4} = %g through Cilium's hive metrics, want 3", v)
	}
	got := egressRules([]netip.Addr{podA, podB, podC}, "10.0.0.0/8", "169.254.0.0/16", "172.31.0.0/16", "192.168.0.0/16")
	for _, pod := range []netip.Addr{podA, podB, podC, podD} {
		want := prefixes("10.0.0.0/8", "169.254.0.0/16", "172.31.0.0/16", "192.168.0.0/16")
		if !slices.Equal(got[pod], want) {
			t.Errorf("before the edit, pod %s egress to %v, want %v (what cilium-cni wrote)", pod, got[pod], want)
		}
	}

	// The edit: 192.168.0.0/16 leaves, 100.64.0.0/10 comes.
	writeFile(t, configPath, "nonMasqueradeCIDRs: [10.0.0.0/8, 100.64.0.0/10]\n")
	wantCIDRs("10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16")
	got = egressRules([]netip.Addr{podA, podB, podC}, "10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.31.0.0/16")
	for _, pod := range []netip.Addr{podA, podB, podC} {
		want := prefixes("10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.31.0.0/16")
		if !slices.Equal(got[pod], want) {
			t.Errorf("after the edit, pod %s egress to %v, want %v", pod, got[pod], want)
		}
	}
	// Pod D is not in status.ipam.used yet: its rules are cilium-cni's.
	if want := prefixes("10.0.0.0/8", "169.254.0.0/16", "172.31.0.0/16", "192.168.0.0/16"); !slices.Equal(got[podD], want) {
		t.Errorf("pod D (unknown to the CiliumNode) egress to %v, want untouched %v", got[podD], want)
	}
	// Every rule of another priority is as it was: the ingress rules
	// cilium-cni wrote, the kernel's own, the foreign priority-110 rule.
	after := listRules(t, nl)
	defer func() { checkOtherPriorities(t, before, after) }()

	// Pod C leaves status.ipam.used while Cilium still routes to it (its
	// ingress rule is there): its egress rules stay. A second edit orders
	// the check: the reconciler handles C's deletes before the new rows.
	updateUsed(t, ctx, fcs, podA, podB)
	// The file watch acts at once: wait until C's rows left eni-rules, so
	// that the edit is not applied to C before its allocation goes.
	for {
		rows, watch := rules.AllWatch(db.ReadTxn())
		hasC := false
		for r := range rows {
			hasC = hasC || r.Pod == podC
		}
		if !hasC {
			break
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatal("pod C's rows stay in eni-rules after it left status.ipam.used")
		}
	}
	writeFile(t, configPath, "nonMasqueradeCIDRs: [10.0.0.0/8, 100.64.0.0/10, 198.18.0.0/15]\n")
	wantCIDRs("10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "198.18.0.0/15")
	got = egressRules([]netip.Addr{podA, podB}, "10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.31.0.0/16", "198.18.0.0/15")
	if want := prefixes("10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.31.0.0/16"); !slices.Equal(got[podC], want) {
		t.Errorf("pod C, gone from status.ipam.used but routed, egress to %v, want kept %v", got[podC], want)
	}
	if want := prefixes("10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.31.0.0/16", "198.18.0.0/15"); !slices.Equal(got[podA], want) {
		t.Errorf("pod A egress to %v, want %v", got[podA], want)
	}

	// cilium-cni's DEL of C removes its ingress rule first; Cilium's own
	// delete of the egress rules would stop at the first CIDR it does not
	// find. enimasq's retried delete removes them.
	ingressC := netlink.NewRule()
	ingressC.Priority, ingressC.Family, ingressC.Table = 20, unix.AF_INET, unix.RT_TABLE_MAIN
	ingressC.Dst = ipNet(netip.PrefixFrom(podC, 32))
	if err := nl.RuleDel(ingressC); err != nil {
		t.Fatalf("delete pod C's ingress rule: %s", err)
	}
	before = slices.DeleteFunc(before, func(r netlink.Rule) bool { return r.Priority == 20 && prefixOf(r.Dst).Addr() == podC })
	// The kernel has no watch for rules here: poll it, bounded.
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := 0
		for _, r := range listRules(t, nl) {
			if r.Priority == 111 && prefixOf(r.Src).Addr() == podC {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod C's %d egress rules are still there 10s after its DEL", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
	after = listRules(t, nl)
}

func checkOtherPriorities(t *testing.T, before, after []netlink.Rule) {
	t.Helper()
	for _, r := range before {
		if r.Priority == 111 {
			continue
		}
		if !slices.ContainsFunc(after, func(a netlink.Rule) bool { return sameRule(a, r) }) {
			t.Errorf("rule %s (priority %d, proto %d) was removed", r, r.Priority, r.Protocol)
		}
	}
	for _, r := range after {
		if r.Priority != 111 && !slices.ContainsFunc(before, func(b netlink.Rule) bool { return sameRule(b, r) }) {
			t.Errorf("rule %s (priority %d) was added", r, r.Priority)
		}
		if r.Priority == 111 && r.Protocol != unix.RTPROT_KERNEL {
			t.Errorf("rule %s has protocol %d, want Cilium's (kernel)", r, r.Protocol)
		}
	}
}

// updateUsed sets the CiliumNode's status.ipam.used to pods, as Cilium's
// IPAM does when it allocates and releases.
func updateUsed(t *testing.T, ctx context.Context, fcs *testutils.FakeClientset, pods ...netip.Addr) {
	t.Helper()
	nodes := fcs.CiliumV2().CiliumNodes()
	node, err := nodes.Get(ctx, nodeTypes.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node = node.DeepCopy()
	node.Status.IPAM.Used = ipamTypes.AllocationMap{}
	for _, pod := range pods {
		node.Status.IPAM.Used[pod.String()] = ipamTypes.AllocationIP{Owner: "shop/" + pod.String(), Resource: podOf[pod].id}
	}
	if _, err := nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update CiliumNode: %s", err)
	}
}

type hiveMetrics struct {
	cell.In
	Metrics []metric.WithMetadata `group:"hive-metrics"`
}

// gatherEnimasq registers the hive metric named "enimasq" in a registry of
// its own, as Cilium's registry does, and returns the value of the sample of
// family name that has a label with value label.
func gatherEnimasq(t *testing.T, hm []metric.WithMetadata, name, label string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	for _, m := range hm {
		if m.Opts().GetConfigName() == "enimasq" {
			reg.MustRegister(m.(prometheus.Collector))
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{...%q...} among enimasq's metrics", name, label)
	return 0
}

// cniAdd does what cilium-cni's interfaceAdd does at ADD
// (plugins/cilium-cni/cmd/interface.go): coalesce the allocation result's
// CIDRs and call Cilium's RoutingInfo.Configure in the pod's network
// namespace (here the test's), with masquerading on in ENI mode.
func cniAdd(t *testing.T, log *slog.Logger, ns netns.NsHandle, pod netip.Addr, e testENI, cidrs []netip.Prefix) {
	t.Helper()
	var all []*net.IPNet
	for _, c := range cidrs {
		all = append(all, ipNet(c))
	}
	v4, _ := ip.CoalesceCIDRs(all)
	var coalesced []string
	for _, c := range v4 {
		coalesced = append(coalesced, c.String())
	}
	info, err := linuxrouting.NewRoutingInfo(log, e.gateway().String(), coalesced, e.mac, strconv.Itoa(e.number), "eni", true)
	if err != nil {
		t.Fatal(err)
	}
	inNetNS(t, ns, func() error { return info.Configure(pod.AsSlice(), 1500, false) })
}

func createCiliumNode(t *testing.T, ctx context.Context, fcs *testutils.FakeClientset) {
	t.Helper()
	node := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: nodeTypes.GetName()}}
	node.Spec.IPAM.Pool = ipamTypes.AllocationMap{}
	node.Status.IPAM.Used = ipamTypes.AllocationMap{}
	node.Status.ENI.ENIs = map[string]awsTypes.ENI{}
	for _, e := range []testENI{eni0, eni1, eni2} {
		node.Status.ENI.ENIs[e.id] = awsTypes.ENI{
			ID: e.id, MAC: e.mac, Number: e.number,
			IP:     ip.Addr{Addr: e.subnet.Addr().Next().Next().Next().Next()},
			Subnet: awsTypes.AwsSubnet{CIDR: ip.Prefix{Prefix: e.subnet}},
			VPC:    awsTypes.AwsVPC{PrimaryCIDR: ip.Prefix{Prefix: vpc}},
		}
	}
	for pod, e := range podOf {
		node.Spec.IPAM.Pool[pod.String()] = ipamTypes.AllocationIP{Resource: e.id}
	}
	for _, pod := range []netip.Addr{podA, podB, podC} {
		node.Status.IPAM.Used[pod.String()] = ipamTypes.AllocationIP{Owner: "shop/" + pod.String(), Resource: podOf[pod].id}
	}
	if _, err := fcs.CiliumV2().CiliumNodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CiliumNode: %s", err)
	}
}

// waitFor waits, on statedb watch channels, until cond holds.
func waitFor(t *testing.T, ctx context.Context, db *statedb.DB, what string, cond func(statedb.ReadTxn) (bool, <-chan struct{})) {
	t.Helper()
	for {
		ok, watch := cond(db.ReadTxn())
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-watch:
		}
	}
}

func dumpIPMasqV4(t *testing.T, bpfRoot string) []netip.Prefix {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpfRoot, "tc", "globals", "cilium_ipmasq_v4"), nil)
	if err != nil {
		t.Fatalf("cilium_ipmasq_v4: %s", err)
	}
	defer m.Close()
	var (
		key   [8]byte
		value [1]byte
		out   []netip.Prefix
	)
	it := m.Iterate()
	for it.Next(&key, &value) {
		addr := netip.AddrFrom4([4]byte(key[4:8]))
		out = append(out, netip.PrefixFrom(addr, int(binary.NativeEndian.Uint32(key[:4]))))
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// inNetNS runs fn on a thread in ns; the thread is not reused after.
func inNetNS(t *testing.T, ns netns.NsHandle, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func addENILink(t *testing.T, nl *netlink.Handle, e testENI) {
	t.Helper()
	mac, _ := net.ParseMAC(e.mac)
	name := "eni" + strconv.Itoa(e.number)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac}, PeerName: name + "p"}
	if err := nl.LinkAdd(veth); err != nil {
		t.Fatalf("veth %s: %s", name, err)
	}
	peer, err := nl.LinkByName(name + "p")
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(peer); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func listRules(t *testing.T, nl *netlink.Handle) []netlink.Rule {
	t.Helper()
	rules, err := nl.RuleList(unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

func sameRule(a, b netlink.Rule) bool {
	return a.Priority == b.Priority && a.Table == b.Table && a.Protocol == b.Protocol &&
		prefixOf(a.Src) == prefixOf(b.Src) && prefixOf(a.Dst) == prefixOf(b.Dst)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	addr, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addr.Unmap(), ones)
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}
