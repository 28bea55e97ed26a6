package datapath

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipam/ipamapi"
	"github.com/enimasq/enimasq/ipam/ipamtest"
)

// sampleSettings are the standalone agent's: its own ingress rules and routes.
var sampleSettings = Settings{EgressMode: EgressModeCIDR, MasqueradeV4: true, EnableIPv4: true,
	PodRules: nodeconfig.EnimasqPodRules, IngressRules: true, Routes: true}

func ruleLines(rules []*Rule) string {
	var b strings.Builder
	for _, r := range rules {
		b.WriteString(r.IPRule())
		b.WriteByte('\n')
	}
	return b.String()
}

func TestPodRulesModes(t *testing.T) {
	n, nonMasq := ipamtest.Samples(t)
	pool := ciliumnode.NewPool(n.ENIs)
	ip := netip.MustParseAddr("10.130.100.133")
	eni, _ := pool.ENI(ip)
	cidrs := ciliumnode.ResultCIDRs(eni, ipamapi.FamilyIPv4, nil, nonMasq)

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
	n, nonMasq := ipamtest.Samples(t)
	pool := ciliumnode.NewPool(n.ENIs)
	allocs := []*allocations.Allocation{
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
