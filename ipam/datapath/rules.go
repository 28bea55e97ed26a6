package datapath

import (
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipam/ipamapi"
)

// This file is the pure part of the datapath: from the ENIs, the
// allocations, the non-masquerade CIDRs and the settings, what the ip rules
// and the routes are. No I/O, no tables.

func addrFamily(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// PodRules are the ip rules of a pod with IP ip on eni:
//
//	20: to <ip> lookup main
//	111: from <ip> to <cidr> lookup <10+number>   (per CIDR; masquerading on, mode cidr)
//	111: from <ip> lookup <10+number>             (masquerading off, or mode all)
//
// cidrs are the allocation result's CIDRs. Rules come back with a zero
// status.
func PodRules(ip netip.Addr, owner string, eni *ciliumnode.ENI, cidrs []netip.Prefix, s Settings) []*Rule {
	host := netip.PrefixFrom(ip, ip.BitLen())
	table := eni.RouteTable()
	var rules []*Rule
	if s.IngressRules {
		// Otherwise the ingress rule is the CNI's alone (cilium-cni's): it
		// does not depend on the ip-masq-agent config.
		rules = append(rules, &Rule{
			RuleKey: RuleKey{Priority: s.PodRules.IngressPriority, To: host, Table: MainTable},
			Pod:     ip, Owner: owner,
		})
	}
	if s.EgressMode == EgressModeCIDR && s.Masquerade(ip) {
		for _, c := range cidrs {
			if c.Bits() == 0 {
				// "to 0.0.0.0/0" is every destination: the kernel (and
				// Cilium) keep no destination at all.
				c = netip.Prefix{}
			}
			rules = append(rules, &Rule{
				RuleKey: RuleKey{Priority: s.PodRules.EgressPriority, From: host, To: c, Table: table},
				Pod:     ip, Owner: owner,
			})
		}
	} else {
		rules = append(rules, &Rule{
			RuleKey: RuleKey{Priority: s.PodRules.EgressPriority, From: host, Table: table},
			Pod:     ip, Owner: owner,
		})
	}
	return rules
}

// ENIRoutes are the routes of an ENI's table:
//
//	<gw>/32 dev <eni> scope link
//	default via <gw> dev <eni>
func ENIRoutes(eni *ciliumnode.ENI) []*Route {
	gw := eni.Gateway
	table := eni.RouteTable()
	unspecified := netip.IPv4Unspecified()
	if !gw.Is4() {
		unspecified = netip.IPv6Unspecified()
	}
	return []*Route{
		{RouteKey: RouteKey{Table: table, Dst: netip.PrefixFrom(gw, gw.BitLen())}, ENI: eni.ID, MAC: eni.MAC},
		{RouteKey: RouteKey{Table: table, Dst: netip.PrefixFrom(unspecified, 0)}, Gateway: gw, ENI: eni.ID, MAC: eni.MAC},
	}
}

// Desired is the desired state for a set of allocations.
type Desired struct {
	Rules  []*Rule
	Routes []*Route
}

// ComputeDesired returns the rules of every allocation placed on a usable
// ENI (placed; of a family the node runs) and the routes of every ENI with at
// least one such allocation. nonMasq are the non-masquerade CIDRs in effect.
func ComputeDesired(allocs []*allocations.Allocation, pool ciliumnode.Pool, nonMasq []netip.Prefix, s Settings) Desired {
	var d Desired
	withPods := map[string]*ciliumnode.ENI{}
	cidrsOf := map[string][]netip.Prefix{} // by ENI ID and family
	for _, a := range allocs {
		eni, ok := placed(pool, a)
		if !ok || !s.FamilyEnabled(a.IP) {
			continue
		}
		fam := ipamapi.FamilyOf(a.IP)
		key := eni.ID + "/" + fam
		cidrs, ok := cidrsOf[key]
		if !ok {
			cidrs = ciliumnode.ResultCIDRs(eni, fam, s.NativeRouting, nonMasq)
			cidrsOf[key] = cidrs
		}
		d.Rules = append(d.Rules, PodRules(a.IP, a.Owner, eni, cidrs, s)...)
		withPods[eni.ID] = eni
	}
	ids := make([]string, 0, len(withPods))
	for id := range withPods {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if !s.Routes {
		// The ENI tables' routes are the CNI's (Cilium's).
		return d
	}
	for _, id := range ids {
		d.Routes = append(d.Routes, ENIRoutes(withPods[id])...)
	}
	return d
}

// formatRule prints a rule the way `ip rule` does (without the protocol).
func formatRule(k RuleKey) string {
	from, to := "all", ""
	if k.From.IsValid() {
		from = hostOrPrefix(k.From)
	}
	if k.To.IsValid() {
		to = " to " + hostOrPrefix(k.To)
	}
	return fmt.Sprintf("%d:\tfrom %s%s lookup %s", k.Priority, from, to, tableName(k.Table))
}

func hostOrPrefix(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// placed is the ENI whose table the rules of a use: the usable ENI its
// allocator placed it on (enimasq's from the pool, the embedding agent's by
// the ENI's addresses), none when it is orphaned, and the pool's when it is
// not placed yet.
func placed(p ciliumnode.Pool, a *allocations.Allocation) (*ciliumnode.ENI, bool) {
	switch {
	case a.State == allocations.StateOrphaned:
		return nil, false
	case a.State == allocations.StateAllocated && a.ENI != "":
		e, ok := p.ByID(a.ENI)
		return e, ok && e.Usable()
	}
	return p.ENI(a.IP)
}
