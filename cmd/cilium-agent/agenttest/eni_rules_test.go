package agenttest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go4.org/netipx"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/test/k8stest"
)

// TestPrivilegedCiliumAgent starts bin/cilium-agent, every cell of Cilium's
// and enimasq's, and shows that the ENI egress rules of every IP Cilium
// configured (pods added with cilium-cni, the router, the health endpoint)
// follow the ip-masq-agent config: after an edit, after a restart with an
// edit made while the agent was stopped, and after a pod's CNI DEL; that
// cilium_ipmasq_v4 equals the config; that cilium-dbg shows enimasq's
// modules healthy and its tables; and that enimasq writes nothing into the
// CiliumNode.
func TestPrivilegedCiliumAgent(t *testing.T) {
	e := newEnv(t)
	b, n, cluster, bpfRoot := e.bins, e.node, e.cluster, celltest.MountBPFFS(t)
	a := newAgent(t, b, n, cluster, bpfRoot, e.libDir)
	a.writeConfig("10.0.0.0/8", "192.168.0.0/16")
	a.start()

	// cilium-dbg sees enimasq: its modules in the health tree, none
	// degraded, and its tables in statedb.
	checkHealth(t, a)
	dump := a.dbg("statedb")
	for _, table := range []string{"ip-masq-agent-cidrs", "masq-map-entries", "eni-rules", "ipam-allocations", "enis",
		"policy-endpoints", "cluster-policy-endpoints", "policy-map-entries", "cluster-policy-map-entries"} {
		if !strings.Contains(dump, table) {
			t.Errorf("cilium-dbg statedb has no table %s", table)
		}
	}

	want := []string{"10.0.0.0/8", "169.254.0.0/16", "192.168.0.0/16"}
	a.waitFor("cilium_ipmasq_v4 = the config", 10*time.Second, mapIs(bpfRoot, want))

	// Two pods, added with cilium-cni as the kubelet's runtime does.
	podA := newPod(t, cluster, "shop", "cart-0")
	podB := newPod(t, cluster, "shop", "cart-1")
	a.cniAdd(podA)
	a.cniAdd(podB)
	t.Logf("pods: A %s, B %s", podA.ip, podB.ip)
	a.waitFor("every IP's egress rules = the config", 10*time.Second, egressRulesAre(a, n, want, podA.ip, podB.ip))
	if rows := a.dbg("shell", "db/show", "eni-rules"); !hasDoneRow(rows, podA.ip) {
		t.Errorf("db/show eni-rules: no Done rule of pod A %s:\n%s", podA.ip, rows)
	} else {
		t.Logf("cilium-dbg shell -- db/show eni-rules:\n%s", rows)
	}
	t.Logf("cilium-dbg shell -- db/show ipam-allocations:\n%s", a.dbg("shell", "db/show", "ipam-allocations"))
	checkUsedMetric(t, a)

	// Rules that are not enimasq's to keep: another priority (Cilium's
	// nodeport and compat rules), another owner's at the egress priority,
	// the ingress rules Cilium wrote. They outlive every edit and restart.
	foreign := addForeignRules(t, n, podA.ip)
	defer checkRulesKept(t, n, foreign)

	// The edit: 192.168.0.0/16 goes, 172.16.0.0/12 and 100.64.0.0/10 come.
	want = []string{"10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12"}
	a.writeConfig("10.0.0.0/8", "172.16.0.0/12", "100.64.0.0/10")
	edit := time.Now()
	mapTook := a.waitFor("cilium_ipmasq_v4 after the edit", time.Second, mapIs(bpfRoot, want))
	a.waitFor("every IP's egress rules after the edit", 2*time.Second, egressRulesAre(a, n, want, podA.ip, podB.ip))
	t.Logf("edit: cilium_ipmasq_v4 in %s, every IP's rules in %s", mapTook.Round(time.Millisecond), time.Since(edit).Round(time.Millisecond))

	// cilium-cni DEL of pod B: its egress rules go.
	if _, err := a.cni("DEL", podB); err != nil {
		t.Fatal(err)
	}
	del := time.Now()
	a.waitFor("no rule of pod B after its DEL", 2*time.Second, func() (bool, string) {
		rules := egressRules(t, n)
		return len(rules[podB.ip]) == 0, fmt.Sprint(rules[podB.ip])
	})
	t.Logf("DEL: pod B's rules gone in %s", time.Since(del).Round(time.Millisecond))
	a.waitFor("every IP's egress rules after the DEL", 2*time.Second, egressRulesAre(a, n, want, podA.ip))

	// An edit made while the agent is stopped, then a restart: Cilium's
	// restore re-adds each IP's rules with the new CIDRs and keeps the old
	// ones; enimasq removes those.
	a.stop()
	want = []string{"10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "198.18.0.0/15"}
	a.writeConfig("10.0.0.0/8", "100.64.0.0/10", "198.18.0.0/15")
	a.start()
	a.waitFor("every IP's egress rules after the restart", 10*time.Second, egressRulesAre(a, n, want, podA.ip))
	a.waitFor("cilium_ipmasq_v4 after the restart", time.Second, mapIs(bpfRoot, want))
	checkHealth(t, a)
	checkUsedMetric(t, a)

	// An invalid file: the module is Degraded in cilium-dbg's health tree,
	// which shows the message alone, naming the file, field and value;
	// the last good CIDRs stay; a good file makes it healthy again.
	a.writeConfigData([]byte(`{"nonMasqueradeCIDRs": ["10.0.0.0/8", "10.300.0.0/16"]}`))
	a.waitFor("ipmasq Degraded, naming the file, field and value", 10*time.Second, func() (bool, string) {
		tree := enimasqTree(a.dbg("status", "--all-health"))
		for _, line := range strings.Split(tree, "\n") {
			if strings.Contains(line, "[DEGRADED]") && strings.Contains(line, a.configPath) &&
				strings.Contains(line, "nonMasqueradeCIDRs") && strings.Contains(line, "10.300.0.0/16") {
				return true, ""
			}
		}
		return false, tree
	})
	a.waitFor("cilium_ipmasq_v4 kept while the file is invalid", time.Second, mapIs(bpfRoot, want))
	a.writeConfig("10.0.0.0/8", "100.64.0.0/10", "198.18.0.0/15")
	checkHealth(t, a)

	// Nothing of enimasq writes the CiliumNode: Cilium v1.20 keeps
	// status.ipam.used empty, and so it stays.
	cn, err := cluster.Get(context.Background(), objects()[1])
	if err != nil {
		t.Fatal(err)
	}
	if used, found, _ := unstructured.NestedMap(cn.Object, "status", "ipam", "used"); found && len(used) > 0 {
		t.Errorf("CiliumNode status.ipam.used = %v: written by someone, and Cilium v1.20 does not", used)
	}
}

// env is what every start of the agent shares: the binaries, the API
// server with Cilium's CRDs, the instance and its Node and CiliumNode, and
// Cilium's bpf sources as --lib-dir.
type env struct {
	bins    bins
	cluster *k8stest.Cluster
	node    *node
	libDir  string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	celltest.RequireRoot(t)
	e := &env{bins: findBins(t), cluster: k8stest.Start(t)}
	mod := ciliumModuleDir(t)
	for _, v := range []string{"v2", "v2alpha1"} {
		e.cluster.InstallCRDs(t, filepath.Join(mod, "pkg", "k8s", "apis", "cilium.io", "client", "crds", v))
	}
	e.node = newNode(t)
	ns, err := netns.GetFromName(e.node.name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	e.cluster.ForwardInto(t, ns)
	e.cluster.MustApply(t, objects()...)
	e.libDir = filepath.Join(t.TempDir(), "lib")
	copyTree(t, filepath.Join(mod, "bpf"), filepath.Join(e.libDir, "bpf"))
	return e
}

// newPod creates the Pod object (the agent looks its labels up when
// cilium-cni creates the endpoint) and its sandbox's network namespace.
func newPod(t testing.TB, c *k8stest.Cluster, namespace, name string) *pod {
	t.Helper()
	p := &pod{namespace: namespace, name: name, containerID: randomSuffix() + randomSuffix() + randomSuffix(),
		netns: "enimasq-pod-" + randomSuffix()}
	addNetNS(t, p.netns)
	c.MustApply(t,
		&unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ServiceAccount",
			"metadata": map[string]any{"name": "default", "namespace": namespace},
		}},
		&unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": name, "namespace": namespace, "labels": map[string]any{"app": "cart"}},
			"spec": map[string]any{
				"nodeName":                     nodeName,
				"automountServiceAccountToken": false,
				"containers":                   []any{map[string]any{"name": "app", "image": "registry.k8s.io/pause:3.10"}},
			},
		}},
	)
	return p
}

// desiredCIDRs is what cilium-cni writes a rule for: the VPC CIDR, the
// native-routing CIDR and the non-masquerade CIDRs of config with
// 169.254.0.0/16 (masqLinkLocal is false), coalesced.
func desiredCIDRs(config []string) []netip.Prefix {
	var b netipx.IPSetBuilder
	b.AddPrefix(vpcCIDR)
	b.AddPrefix(netip.MustParsePrefix("169.254.0.0/16"))
	for _, c := range config {
		b.AddPrefix(netip.MustParsePrefix(c))
	}
	set, _ := b.IPSet()
	return set.Prefixes()
}

// egressRules are the kernel's priority-111 rules from one address into an
// ENI table, by source: what Cilium and enimasq write.
func egressRules(t testing.TB, n *node) map[netip.Addr][]netip.Prefix {
	t.Helper()
	rules, err := n.handle.RuleList(unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr][]netip.Prefix{}
	for _, r := range rules {
		if r.Priority != 111 || r.Src == nil || r.Table < 10 || r.Protocol != unix.RTPROT_KERNEL {
			continue
		}
		src := prefixOf(r.Src)
		if !src.IsSingleIP() {
			continue
		}
		dst := prefixOf(r.Dst)
		if !dst.IsValid() {
			dst = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		}
		if r.Table != eni1.routeTable() {
			dst = netip.Prefix{} // a wrong table never equals a desired rule
		}
		out[src.Addr()] = append(out[src.Addr()], dst)
	}
	for _, ps := range out {
		slices.SortFunc(ps, netip.Prefix.Compare)
	}
	return out
}

// addForeignRules adds rules of pod that are not enimasq's (another
// priority; another protocol at the egress priority) and returns them with
// the ingress rules Cilium wrote, all of which must stay.
func addForeignRules(t testing.TB, n *node, pod netip.Addr) []netlink.Rule {
	t.Helper()
	from := ipNet(netip.PrefixFrom(pod, 32))
	to := ipNet(netip.MustParsePrefix("8.8.8.0/24"))
	for _, r := range []struct{ prio, proto int }{{110, unix.RTPROT_KERNEL}, {109, unix.RTPROT_KERNEL}, {111, unix.RTPROT_STATIC}} {
		rule := netlink.NewRule()
		rule.Priority, rule.Family, rule.Table, rule.Protocol = r.prio, unix.AF_INET, eni1.routeTable(), uint8(r.proto)
		rule.Src, rule.Dst = from, to
		if err := n.handle.RuleAdd(rule); err != nil {
			t.Fatalf("foreign rule %d proto %d: %s", r.prio, r.proto, err)
		}
	}
	rules, err := n.handle.RuleList(unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	var kept []netlink.Rule
	for _, r := range rules {
		ofPod := prefixOf(r.Src).Addr() == pod || prefixOf(r.Dst).Addr() == pod
		kernel := r.Priority == 0 || r.Priority == 32766 || r.Priority == 32767
		if (ofPod || kernel) && !(r.Priority == 111 && r.Protocol == unix.RTPROT_KERNEL) {
			kept = append(kept, r)
		}
	}
	if len(kept) < 3+1+3 { // the foreign ones, the pod's ingress rule, the kernel's
		t.Fatalf("rules to keep: %v", kept)
	}
	return kept
}

// checkRulesKept: every rule of rules is still in the kernel.
func checkRulesKept(t testing.TB, n *node, rules []netlink.Rule) {
	t.Helper()
	now, err := n.handle.RuleList(unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	same := func(a, b netlink.Rule) bool {
		return a.Priority == b.Priority && a.Table == b.Table && a.Protocol == b.Protocol &&
			prefixOf(a.Src) == prefixOf(b.Src) && prefixOf(a.Dst) == prefixOf(b.Dst)
	}
	for _, r := range rules {
		if !slices.ContainsFunc(now, func(x netlink.Rule) bool { return same(x, r) }) {
			t.Errorf("rule %s (priority %d, proto %d) was removed: not enimasq's", r, r.Priority, r.Protocol)
		}
	}
}

// ciliumIPs are the IPs Cilium configured ENI rules for: its endpoints'
// (pods, health) and the router's (cilium_host).
func ciliumIPs(a *agent, n *node) ([]netip.Addr, error) {
	out, err := a.dbgErr("endpoint", "list", "-o", "json")
	if err != nil {
		return nil, fmt.Errorf("cilium-dbg endpoint list: %w: %s", err, out)
	}
	var eps []struct {
		Status struct {
			Networking struct {
				Addressing []struct {
					IPv4 string `json:"ipv4"`
				} `json:"addressing"`
			} `json:"networking"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &eps); err != nil {
		return nil, fmt.Errorf("cilium-dbg endpoint list: %w", err)
	}
	var ips []netip.Addr
	for _, ep := range eps {
		for _, ad := range ep.Status.Networking.Addressing {
			if ip, err := netip.ParseAddr(ad.IPv4); err == nil {
				ips = append(ips, ip)
			}
		}
	}
	host, err := n.handle.LinkByName("cilium_host")
	if err != nil {
		return nil, fmt.Errorf("cilium_host: %w", err)
	}
	addrs, err := n.handle.AddrList(host, unix.AF_INET)
	if err != nil {
		return nil, err
	}
	for _, ad := range addrs {
		if ip, ok := netip.AddrFromSlice(ad.IP); ok && eni1.holds(ip.Unmap()) {
			ips = append(ips, ip.Unmap())
		}
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	return slices.Compact(ips), nil
}

// egressRulesAre holds when the IPs with egress rules are exactly Cilium's
// (pods among them) and each has exactly one rule per desired CIDR.
func egressRulesAre(a *agent, n *node, config []string, pods ...netip.Addr) func() (bool, string) {
	return func() (bool, string) {
		ips, err := ciliumIPs(a, n)
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods {
			if !slices.Contains(ips, p) {
				return false, fmt.Sprintf("pod %s is not among Cilium's IPs %v", p, ips)
			}
		}
		if len(ips) < len(pods)+2 {
			return false, fmt.Sprintf("Cilium's IPs %v: want the pods, the router and the health endpoint", ips)
		}
		return exactRules(a.t, n, ips, config)()
	}
}

// exactRules holds when exactly ips have egress rules, each exactly one
// per desired CIDR of config.
func exactRules(t testing.TB, n *node, ips []netip.Addr, config []string) func() (bool, string) {
	want := desiredCIDRs(config)
	return func() (bool, string) {
		got := egressRules(t, n)
		var bad []string
		for _, ip := range ips {
			if !slices.Equal(got[ip], want) {
				bad = append(bad, fmt.Sprintf("%s: %v, want %v", ip, got[ip], want))
			}
		}
		for ip, rules := range got {
			if !slices.Contains(ips, ip) {
				bad = append(bad, fmt.Sprintf("%s (not Cilium's): %v, want none", ip, rules))
			}
		}
		return len(bad) == 0, strings.Join(bad, "\n")
	}
}

func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	addr, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addr.Unmap(), ones)
}
