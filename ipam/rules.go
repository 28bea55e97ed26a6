package ipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"github.com/enimasq/enimasq/cells/prefixorder"
	"github.com/enimasq/enimasq/ipam/ipamapi"

	"go4.org/netipx"
	"golang.org/x/sys/unix"
)

// This file is the pure part of the cell: from the ENIs, the allocations,
// the non-masquerade CIDRs and the flags, what the allocation results, the
// ip rules and the routes are. No I/O, no tables.

const (
	FamilyIPv4 = "ipv4"
	FamilyIPv6 = "ipv6"
)

func familyOf(a netip.Addr) string {
	if a.Is4() {
		return FamilyIPv4
	}
	return FamilyIPv6
}

func addrFamily(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// CoalesceCIDRs is the smallest set of prefixes that covers exactly the
// addresses of in (contained prefixes and duplicates dropped, adjacent ones
// merged), sorted by address, IPv4 first. It is the set cilium-cni writes
// rules for (Cilium's ip.CoalesceCIDRs), so that the rules enimasq keeps in
// the Cilium build are the ones cilium-cni wrote, and both builds write the
// same rules. Invalid prefixes are dropped.
func CoalesceCIDRs(in []netip.Prefix) []netip.Prefix {
	var b netipx.IPSetBuilder
	for _, p := range in {
		if p.IsValid() {
			b.AddPrefix(p.Masked())
		}
	}
	set, _ := b.IPSet() // only errors on invalid input, dropped above
	out := set.Prefixes()
	if len(out) == 0 {
		return nil
	}
	slices.SortFunc(out, prefixorder.Compare)
	return out
}

// ResultCIDRs are the CIDRs of an allocation result for an address of the
// given family on the ENI: the VPC primary CIDR, the VPC CIDRs,
// --ipv4-native-routing-cidr and the non-masquerade CIDRs, those of the
// family only, coalesced. As in Cilium (#40141), traffic to them is not
// masqueraded and must leave by the pod's ENI.
func ResultCIDRs(eni *ENI, nonMasq []netip.Prefix, s Settings, family string) []netip.Prefix {
	var all []netip.Prefix
	all = append(all, eni.VPCCIDRsAll()...)
	if s.NativeRoutingCIDR.IsValid() {
		all = append(all, s.NativeRoutingCIDR)
	}
	if s.NativeRoutingCIDRv6.IsValid() {
		all = append(all, s.NativeRoutingCIDRv6)
	}
	all = append(all, nonMasq...)
	mine := all[:0]
	for _, p := range all {
		if familyOf(p.Addr()) == family {
			mine = append(mine, p)
		}
	}
	return CoalesceCIDRs(mine)
}

// AllocationResult is what an allocation returns (ipamapi).
type AllocationResult = ipamapi.AllocationResult

// NewResult builds the allocation result of ip on eni.
func NewResult(ip netip.Addr, eni *ENI, nonMasq []netip.Prefix, s Settings) AllocationResult {
	cidrs := ResultCIDRs(eni, nonMasq, s, familyOf(ip))
	r := AllocationResult{
		IP:              ip.String(),
		Gateway:         eni.Gateway.String(),
		CIDRs:           make([]string, len(cidrs)),
		MasterMAC:       eni.MAC,
		InterfaceNumber: strconv.Itoa(eni.Number),
	}
	for i, p := range cidrs {
		r.CIDRs[i] = p.String()
	}
	return r
}

// Pool is the set of IPs handed out: spec.ipam.pool on usable ENIs.
type Pool struct {
	byID  map[string]*ENI
	byIP  map[netip.Addr]*ENI
	order []netip.Addr // by ENI number, ENI ID, then address
	// skipped maps the IPs of unusable ENIs to their ENI, for errors.
	skipped map[netip.Addr]*ENI
}

// NewPool indexes the pool IPs of the ENIs. An IP listed on two ENIs (the
// parser refuses that) goes to the first in (number, ID) order.
func NewPool(enis []*ENI) Pool {
	sorted := slices.Clone(enis)
	slices.SortFunc(sorted, func(a, b *ENI) int {
		if c := cmp.Compare(a.Number, b.Number); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	p := Pool{byID: map[string]*ENI{}, byIP: map[netip.Addr]*ENI{}, skipped: map[netip.Addr]*ENI{}}
	for _, e := range sorted {
		p.byID[e.ID] = e
		for _, ip := range e.Pool {
			if !e.Usable() {
				p.skipped[ip] = e
				continue
			}
			if _, dup := p.byIP[ip]; dup {
				continue
			}
			p.byIP[ip] = e
			p.order = append(p.order, ip)
		}
	}
	return p
}

// ENI returns the ENI that hands out ip.
func (p Pool) ENI(ip netip.Addr) (*ENI, bool) {
	e, ok := p.byIP[ip]
	return e, ok
}

// placed is the ENI whose table the rules of a use: the usable ENI its
// allocator placed it on (enimasq's from the pool, the embedding agent's by
// the ENI's addresses: ExternalAllocations), none when it is orphaned, and
// the pool's when it is not placed yet.
func (p Pool) placed(a *Allocation) (*ENI, bool) {
	switch {
	case a.State == StateOrphaned:
		return nil, false
	case a.State == StateAllocated && a.ENI != "":
		e, ok := p.byID[a.ENI]
		return e, ok && e.Usable()
	}
	return p.ENI(a.IP)
}

// Len is the number of IPs in the pool.
func (p Pool) Len() int { return len(p.order) }

// Next returns the first IP of the family for which taken is false.
func (p Pool) Next(family string, taken func(netip.Addr) bool) (netip.Addr, bool) {
	for _, ip := range p.order {
		if familyOf(ip) == family && !taken(ip) {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// whyNotInPool explains why ip is not handed out.
func (p Pool) whyNotInPool(ip netip.Addr) string {
	if e, ok := p.skipped[ip]; ok {
		return fmt.Sprintf("%s is on %s, which is skipped (%s)", ip, e.ID, e.Skipped)
	}
	return fmt.Sprintf("%s is not in spec.ipam.pool of a usable ENI", ip)
}

// placement is where an allocation stands against the pool.
func (p Pool) placement(a *Allocation) (eni string, state AllocationState, reason string) {
	if e, ok := p.ENI(a.IP); ok {
		return e.ID, StateAllocated, ""
	}
	return "", StateOrphaned, p.whyNotInPool(a.IP) + ": its rules are removed; release it"
}

// PodRules are the ip rules of a pod with IP ip on eni:
//
//	20: to <ip> lookup main
//	111: from <ip> to <cidr> lookup <10+number>   (per CIDR; masquerading on, mode cidr)
//	111: from <ip> lookup <10+number>             (masquerading off, or mode all)
//
// cidrs are the allocation result's CIDRs. Rules come back with a zero
// status.
func PodRules(ip netip.Addr, owner string, eni *ENI, cidrs []netip.Prefix, s Settings) []*Rule {
	host := netip.PrefixFrom(ip, ip.BitLen())
	table := eni.RouteTable()
	var rules []*Rule
	if s.OwnsAllocations() {
		// With Cilium's IPAM the ingress rule is cilium-cni's alone: it does
		// not depend on the ip-masq-agent config.
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
func ENIRoutes(eni *ENI) []*Route {
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
// ENI (Pool.placed; of a family the node runs) and the routes of every ENI with at
// least one such allocation. nonMasq are the non-masquerade CIDRs in effect.
func ComputeDesired(allocs []*Allocation, pool Pool, nonMasq []netip.Prefix, s Settings) Desired {
	var d Desired
	withPods := map[string]*ENI{}
	cidrsOf := map[string][]netip.Prefix{} // by ENI ID and family
	for _, a := range allocs {
		eni, ok := pool.placed(a)
		if !ok || !s.FamilyEnabled(a.IP) {
			continue
		}
		fam := familyOf(a.IP)
		key := eni.ID + "/" + fam
		cidrs, ok := cidrsOf[key]
		if !ok {
			cidrs = ResultCIDRs(eni, nonMasq, s, fam)
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
	if !s.OwnsAllocations() {
		// With Cilium's IPAM the ENI tables' routes are Cilium's.
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
