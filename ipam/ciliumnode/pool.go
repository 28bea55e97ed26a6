package ciliumnode

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"go4.org/netipx"

	"github.com/enimasq/enimasq/cells/prefixorder"
	"github.com/enimasq/enimasq/ipam/ipamapi"
)

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
// the native-routing CIDRs (--ipv4/ipv6-native-routing-cidr; invalid ones
// are unset) and the non-masquerade CIDRs, those of the
// family only, coalesced. As in Cilium (#40141), traffic to them is not
// masqueraded and must leave by the pod's ENI.
func ResultCIDRs(eni *ENI, family string, nativeRouting, nonMasq []netip.Prefix) []netip.Prefix {
	var all []netip.Prefix
	all = append(all, eni.VPCCIDRsAll()...)
	for _, p := range nativeRouting {
		if p.IsValid() {
			all = append(all, p)
		}
	}
	all = append(all, nonMasq...)
	mine := all[:0]
	for _, p := range all {
		if ipamapi.FamilyOf(p.Addr()) == family {
			mine = append(mine, p)
		}
	}
	return CoalesceCIDRs(mine)
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

// ByID returns the ENI with the ID, usable or not.
func (p Pool) ByID(id string) (*ENI, bool) {
	e, ok := p.byID[id]
	return e, ok
}

// IPs are the pool's IPs, in the order they are handed out.
func (p Pool) IPs() []netip.Addr { return p.order }

// Len is the number of IPs in the pool.
func (p Pool) Len() int { return len(p.order) }

// Next returns the first IP of the family for which taken is false.
func (p Pool) Next(family string, taken func(netip.Addr) bool) (netip.Addr, bool) {
	for _, ip := range p.order {
		if ipamapi.FamilyOf(ip) == family && !taken(ip) {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// WhyNotInPool explains why ip is not handed out.
func (p Pool) WhyNotInPool(ip netip.Addr) string {
	if e, ok := p.skipped[ip]; ok {
		return fmt.Sprintf("%s is on %s, which is skipped (%s)", ip, e.ID, e.Skipped)
	}
	return fmt.Sprintf("%s is not in spec.ipam.pool of a usable ENI", ip)
}
