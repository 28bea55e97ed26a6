package ipam

import (
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/ipmasq"
)

func samplePrefixes(t testing.TB, ss ...string) []netip.Prefix {
	t.Helper()
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// sampleInputs are the sample CiliumNode and the non-masquerade CIDRs of the
// sample ip-masq-agent config.
func sampleInputs(t testing.TB) (*CiliumNode, []netip.Prefix) {
	t.Helper()
	n, err := ReadCiliumNodeFile("../test/testdata/samples/ciliumnode.yaml")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("../test/testdata/samples/ip-masq-agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d, err := ipmasq.Parse("sample", data)
	if err != nil {
		t.Fatal(err)
	}
	var cidrs []netip.Prefix
	for _, c := range d.CIDRs {
		cidrs = append(cidrs, c.Prefix)
	}
	return n, cidrs
}

var sampleSettings = Settings{EgressMode: EgressModeCIDR, MasqueradeV4: true, EnableIPv4: true,
	Allocator: nodeconfig.AllocatorEnimasq, PodRules: nodeconfig.EnimasqPodRules}

func TestSampleAllocationResult(t *testing.T) {
	n, nonMasq := sampleInputs(t)
	pool := NewPool(n.ENIs)
	ip := netip.MustParseAddr("10.130.100.133")
	eni, ok := pool.ENI(ip)
	if !ok {
		t.Fatalf("%s not in the pool", ip)
	}
	got := NewResult(ip, eni, nonMasq, sampleSettings)
	want := AllocationResult{
		IP:      "10.130.100.133",
		Gateway: "10.130.96.1",
		// The VPC CIDRs 10.128.0.0/13 and 100.112.0.0/13 are inside
		// 10.0.0.0/8 and 100.64.0.0/10; fe80::/10 is IPv6.
		CIDRs:           []string{"10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"},
		MasterMAC:       "0a:58:0a:82:64:0a",
		InterfaceNumber: "1",
	}
	if !slices.Equal(got.CIDRs, want.CIDRs) || got.IP != want.IP || got.Gateway != want.Gateway ||
		got.MasterMAC != want.MasterMAC || got.InterfaceNumber != want.InterfaceNumber {
		t.Errorf("result\n got %+v\nwant %+v", got, want)
	}

	// Without the ip-masq-agent: the VPC CIDRs and the native routing CIDR.
	s := sampleSettings
	s.NativeRoutingCIDR = netip.MustParsePrefix("10.130.0.0/16")
	got = NewResult(ip, eni, nil, s)
	if want := []string{"10.128.0.0/13", "100.112.0.0/13"}; !slices.Equal(got.CIDRs, want) {
		t.Errorf("without ip-masq-agent: %v, want %v (10.130.0.0/16 is inside the VPC)", got.CIDRs, want)
	}
	s.NativeRoutingCIDR = netip.MustParsePrefix("10.200.0.0/16")
	got = NewResult(ip, eni, nil, s)
	if want := []string{"10.128.0.0/13", "10.200.0.0/16", "100.112.0.0/13"}; !slices.Equal(got.CIDRs, want) {
		t.Errorf("native routing CIDR: %v, want %v", got.CIDRs, want)
	}
}

// Linked into Cilium, the rules are cilium-cni's: one per CIDR whenever the
// family is masqueraded (BPF or iptables), a CIDR of 0.0.0.0/0 is a rule
// without destination, no ingress rule is enimasq's, and the "all" mode
// that would fight Cilium's restore is refused.
func TestSettingsLinkedIntoCilium(t *testing.T) {
	node := nodeconfig.Config{
		EnableIPv4: true,
		Masquerade: nodeconfig.Masquerade{BPF: false, IPv4: true}, // iptables masquerading: still per CIDR
		IPAM: nodeconfig.IPAM{Mode: IPAMModeENI, Allocator: nodeconfig.AllocatorCilium,
			PodRules: nodeconfig.PodRules{IngressPriority: 20, EgressPriority: 111, TableOffset: 10, Protocol: 2}},
	}
	s, err := NewSettings(DefaultConfig, node)
	if err != nil {
		t.Fatal(err)
	}
	if !s.MasqueradeV4 || s.OwnsAllocations() {
		t.Errorf("settings %+v: want per-CIDR rules (cilium-cni's masq = --enable-ipv4-masquerade) and Cilium's allocations", s)
	}
	eni := &ENI{ID: "eni-1", Number: 1}
	rules := PodRules(netip.MustParseAddr("10.0.1.5"), "a/b", eni, samplePrefixes(t, "0.0.0.0/0"), s)
	if len(rules) != 1 || rules[0].Priority != 111 || rules[0].To.IsValid() || rules[0].Table != 11 {
		t.Errorf("rules %v: want one 111 rule without destination into table 11, no ingress rule", ruleLines(rules))
	}

	cfg := DefaultConfig
	cfg.ENIEgressRuleMode = EgressModeAll
	if _, err := NewSettings(cfg, node); err == nil || !strings.Contains(err.Error(), "--eni-egress-rule-mode") {
		t.Errorf("mode all linked into Cilium: %v", err)
	}
	node.IPAM.Mode = "cluster-pool"
	if s, err := NewSettings(DefaultConfig, node); err != nil || s.Off == "" {
		t.Errorf("Cilium with cluster-pool IPAM: settings %+v, %v: want off, no error", s, err)
	}
	node.IPAM.Allocator = nodeconfig.AllocatorEnimasq
	if _, err := NewSettings(DefaultConfig, node); err == nil || !strings.Contains(err.Error(), "--ipam") {
		t.Errorf("standalone with cluster-pool IPAM: %v", err)
	}
}

func TestCoalesceCIDRs(t *testing.T) {
	for _, tc := range []struct {
		in, want []string
	}{
		{nil, nil},
		{[]string{"10.0.0.0/8", "10.128.0.0/13", "10.0.0.0/8"}, []string{"10.0.0.0/8"}},
		{[]string{"10.128.0.0/13", "10.0.0.0/8"}, []string{"10.0.0.0/8"}},
		{[]string{"10.1.2.3/8"}, []string{"10.0.0.0/8"}},
		{[]string{"0.0.0.0/0", "192.168.0.0/16", "fe80::/10"}, []string{"0.0.0.0/0", "fe80::/10"}},
		// Adjacent prefixes merge, as Cilium's ip.CoalesceCIDRs (and so
		// cilium-cni) does.
		{[]string{"192.168.1.0/24", "192.168.0.0/24", "172.16.0.0/12"}, []string{"172.16.0.0/12", "192.168.0.0/23"}},
		{[]string{"10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/24"}, []string{"10.0.0.0/23", "10.0.2.0/24"}},
		{[]string{"10.0.0.0/16", "10.1.0.0/16"}, []string{"10.0.0.0/15"}},
		{[]string{"::/0", "10.0.0.0/8"}, []string{"10.0.0.0/8", "::/0"}},
	} {
		got := CoalesceCIDRs(samplePrefixes(t, tc.in...))
		var gotS []string
		for _, p := range got {
			gotS = append(gotS, p.String())
		}
		if !slices.Equal(gotS, tc.want) {
			t.Errorf("CoalesceCIDRs(%v) = %v, want %v", tc.in, gotS, tc.want)
		}
	}
}

func ruleLines(rules []*Rule) string {
	var b strings.Builder
	for _, r := range rules {
		b.WriteString(r.IPRule())
		b.WriteByte('\n')
	}
	return b.String()
}

func TestPodRulesModes(t *testing.T) {
	n, nonMasq := sampleInputs(t)
	pool := NewPool(n.ENIs)
	ip := netip.MustParseAddr("10.130.100.133")
	eni, _ := pool.ENI(ip)
	cidrs := ResultCIDRs(eni, nonMasq, sampleSettings, FamilyIPv4)

	got := ruleLines(PodRules(ip, "shop/web", eni, cidrs, sampleSettings))
	want := "20:\tfrom all to 10.130.100.133 lookup main\n" +
		"111:\tfrom 10.130.100.133 to 10.0.0.0/8 lookup 11\n" +
		"111:\tfrom 10.130.100.133 to 100.64.0.0/10 lookup 11\n" +
		"111:\tfrom 10.130.100.133 to 169.254.0.0/16 lookup 11\n" +
		"111:\tfrom 10.130.100.133 to 172.16.0.0/12 lookup 11\n" +
		"111:\tfrom 10.130.100.133 to 192.168.0.0/16 lookup 11\n"
	if got != want {
		t.Errorf("mode cidr:\n%s\nwant:\n%s", got, want)
	}

	one := "20:\tfrom all to 10.130.100.133 lookup main\n" +
		"111:\tfrom 10.130.100.133 lookup 11\n"
	all := sampleSettings
	all.EgressMode = EgressModeAll
	if got := ruleLines(PodRules(ip, "shop/web", eni, cidrs, all)); got != one {
		t.Errorf("mode all:\n%s\nwant:\n%s", got, one)
	}
	off := sampleSettings
	off.MasqueradeV4 = false
	if got := ruleLines(PodRules(ip, "shop/web", eni, cidrs, off)); got != one {
		t.Errorf("masquerade off:\n%s\nwant:\n%s", got, one)
	}
}

func TestComputeDesired(t *testing.T) {
	n, nonMasq := sampleInputs(t)
	pool := NewPool(n.ENIs)
	allocs := []*Allocation{
		{IP: netip.MustParseAddr("10.130.100.133"), Owner: "shop/a"},
		{IP: netip.MustParseAddr("10.130.100.134"), Owner: "shop/b"},
		{IP: netip.MustParseAddr("10.130.112.20"), Owner: "shop/c"},
		// Not in the pool (ENI 0 is below first-interface-index 1): no rules.
		{IP: netip.MustParseAddr("10.130.0.10"), Owner: "shop/orphan"},
		{IP: netip.MustParseAddr("10.9.9.9"), Owner: "shop/gone"},
	}
	d := ComputeDesired(allocs, pool, nonMasq, sampleSettings)
	if len(d.Rules) != 3*6 {
		t.Errorf("%d rules, want 18:\n%s", len(d.Rules), ruleLines(d.Rules))
	}
	for _, r := range d.Rules {
		if r.Owner == "shop/orphan" || r.Owner == "shop/gone" {
			t.Errorf("rule for an IP outside the pool: %s", r.IPRule())
		}
	}
	var routes []string
	for _, r := range d.Routes {
		routes = append(routes, strings.Join(r.TableRow()[:5], " "))
	}
	want := []string{
		"11 10.130.96.1 - eni-0a1b2c3d4e5f00001 0a:58:0a:82:64:0a",
		"11 default 10.130.96.1 eni-0a1b2c3d4e5f00001 0a:58:0a:82:64:0a",
		"12 10.130.112.1 - eni-0a1b2c3d4e5f00002 0a:58:0a:82:70:0a",
		"12 default 10.130.112.1 eni-0a1b2c3d4e5f00002 0a:58:0a:82:70:0a",
	}
	if !slices.Equal(routes, want) {
		t.Errorf("routes:\n%s\nwant:\n%s", strings.Join(routes, "\n"), strings.Join(want, "\n"))
	}

	// An ENI without pods has no routes.
	d = ComputeDesired(allocs[:1], pool, nonMasq, sampleSettings)
	if len(d.Routes) != 2 || d.Routes[0].Table != 11 {
		t.Errorf("one pod on ENI 1: routes %v", d.Routes)
	}

	// A family the node does not run gets nothing.
	noV4 := sampleSettings
	noV4.EnableIPv4 = false
	if d := ComputeDesired(allocs, pool, nonMasq, noV4); len(d.Rules)+len(d.Routes) != 0 {
		t.Errorf("IPv4 disabled: %d rules, %d routes", len(d.Rules), len(d.Routes))
	}
}

func TestPoolNextAndPlacement(t *testing.T) {
	n, _ := sampleInputs(t)
	pool := NewPool(n.ENIs)
	var got []string
	taken := map[netip.Addr]bool{}
	for {
		ip, ok := pool.Next(FamilyIPv4, func(ip netip.Addr) bool { return taken[ip] })
		if !ok {
			break
		}
		taken[ip] = true
		got = append(got, ip.String())
	}
	want := []string{"10.130.100.133", "10.130.100.134", "10.130.100.135", "10.130.112.20", "10.130.112.21"}
	if !slices.Equal(got, want) {
		t.Errorf("allocation order %v, want %v", got, want)
	}
	if _, ok := pool.Next(FamilyIPv6, func(netip.Addr) bool { return false }); ok {
		t.Error("an IPv6 address from an IPv4 pool")
	}
	eni, state, reason := pool.placement(&Allocation{IP: netip.MustParseAddr("10.130.0.10")})
	if eni != "" || state != StateOrphaned || !strings.Contains(reason, "not in spec.ipam.pool") {
		t.Errorf("placement of ENI 0's IP: %q %q %q", eni, state, reason)
	}
}

func TestRuleKeyRoundTrip(t *testing.T) {
	for _, k := range []RuleKey{
		{Priority: 111, From: netip.MustParsePrefix("10.130.100.133/32"), To: netip.MustParsePrefix("10.0.0.0/8"), Table: 11},
		{Priority: 20, To: netip.MustParsePrefix("10.130.100.133/32"), Table: MainTable},
		{Priority: 111, From: netip.MustParsePrefix("2001:db8::1/128"), Table: 12},
	} {
		got, err := ParseRuleKey(k.String())
		if err != nil || got != k {
			t.Errorf("ParseRuleKey(%q) = %v, %v", k.String(), got, err)
		}
	}
}
