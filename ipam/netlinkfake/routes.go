package netlinkfake

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/kernel"
	"github.com/enimasq/enimasq/cells/prefixorder"
)

// fakeRoute is a route as the kernel keeps it; family, table, dst, tos and
// priority are its key.
type fakeRoute struct {
	family   int
	table    int
	dst      netip.Prefix
	tos      int
	priority int
	gw       netip.Addr
	link     int
	protocol netlink.RouteProtocol
	scope    netlink.Scope
	typ      int
}

func (r fakeRoute) sameKey(o fakeRoute) bool {
	return r.family == o.family && r.table == o.table && r.dst == o.dst && r.tos == o.tos && r.priority == o.priority
}

// toFakeRoute reads r as netlink.Handle sends it: table main when none,
// the destination 0/0 of the family when none.
func toFakeRoute(op string, r *netlink.Route) (fakeRoute, error) {
	switch {
	case len(r.MultiPath) > 0, r.Encap != nil, r.Via != nil, r.MPLSDst != nil, r.NewDst != nil, r.Src != nil:
		return fakeRoute{}, notModelled(op, "multipath, encapsulation, MPLS, via and preferred-source routes")
	}
	fr := fakeRoute{
		family: r.Family, table: r.Table, tos: r.Tos, priority: r.Priority,
		link: r.LinkIndex, protocol: r.Protocol, scope: r.Scope, typ: r.Type,
		dst: prefixOf(r.Dst),
	}
	if r.Gw != nil {
		gw, ok := netip.AddrFromSlice(r.Gw)
		if !ok {
			return fakeRoute{}, fmt.Errorf("fake netlink: %s: gateway %v: %w", op, r.Gw, unix.EINVAL)
		}
		fr.gw = gw.Unmap()
	}
	switch {
	case fr.dst.IsValid():
		fr.family = familyOf(fr.dst.Addr())
	case fr.gw.IsValid():
		fr.family = familyOf(fr.gw)
	}
	if fr.family == 0 {
		fr.family = unix.AF_INET
	}
	if !fr.dst.IsValid() {
		if fr.family == unix.AF_INET6 {
			fr.dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		} else {
			fr.dst = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		}
	}
	if fr.dst != fr.dst.Masked() {
		return fakeRoute{}, fmt.Errorf("fake netlink: %s %s: invalid prefix for given prefix length: %w", op, fr.dst, unix.EINVAL)
	}
	if fr.table == 0 {
		fr.table = unix.RT_TABLE_MAIN
	}
	return fr, nil
}

// reaches is the kernel's check of a gateway: a route of a narrower scope
// than the new route's that holds it, in the route's table, else in main.
func (f *Netlink) reaches(r fakeRoute) (fakeRoute, bool) {
	for _, table := range []int{r.table, unix.RT_TABLE_MAIN} {
		var best fakeRoute
		found := false
		for _, via := range f.routes {
			if via.table == table && via.family == r.family && via.scope > r.scope && via.dst.Contains(r.gw) &&
				(!found || via.dst.Bits() > best.dst.Bits()) {
				best, found = via, true
			}
		}
		if found {
			return best, true
		}
	}
	return fakeRoute{}, false
}

// RouteReplace adds the route, or replaces the one of its key (`ip route
// replace`).
func (f *Netlink) RouteReplace(r *netlink.Route) error {
	q, err := toFakeRoute("ip route replace", r)
	if err != nil {
		return err
	}
	if q.protocol == 0 {
		q.protocol = unix.RTPROT_BOOT
	}
	if q.typ == 0 {
		q.typ = unix.RTN_UNICAST
	}
	if q.typ != unix.RTN_UNICAST {
		return notModelled("ip route replace", "a route type other than unicast")
	}
	if q.family == unix.AF_INET6 && q.priority == 0 {
		q.priority = 1024 // IP6_RT_PRIO_USER
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.link != 0 && !f.linkExists(q.link) {
		return fmt.Errorf("fake netlink: ip route replace %s: link %d: %w", q.dst, q.link, unix.ENODEV)
	}
	onlink := r.Flags&int(netlink.FLAG_ONLINK) != 0
	if onlink && q.link == 0 {
		return fmt.Errorf("fake netlink: ip route replace %s onlink: no device: %w", q.dst, unix.EINVAL)
	}
	if q.gw.IsValid() && !onlink { // onlink: the gateway is taken as on the link, unchecked
		if q.scope >= netlink.SCOPE_LINK {
			return fmt.Errorf("fake netlink: ip route replace %s: a gateway needs a scope below link: %w", q.dst, unix.EINVAL)
		}
		via, ok := f.reaches(q)
		if !ok {
			return fmt.Errorf("fake netlink: ip route replace %s via %s table %d: %w", q.dst, q.gw, q.table, unix.ENETUNREACH)
		}
		if q.link == 0 {
			q.link = via.link
		}
	}
	if q.link == 0 {
		return fmt.Errorf("fake netlink: ip route replace %s: no device: %w", q.dst, unix.ENODEV)
	}
	if i := slices.IndexFunc(f.routes, q.sameKey); i >= 0 {
		f.routes[i] = q
	} else {
		f.routes = append(f.routes, q)
	}
	f.emit(kernel.RouteAdded, q.family)
	return nil
}

// matchesRouteDelete is the kernel's fib_table_delete: the key, and every
// attribute the delete gives (the scope unless RT_SCOPE_NOWHERE).
func matchesRouteDelete(stored, q fakeRoute) bool {
	return stored.family == q.family && stored.table == q.table && stored.dst == q.dst && stored.tos == q.tos &&
		(q.priority == 0 || stored.priority == q.priority) &&
		(q.scope == netlink.SCOPE_NOWHERE || stored.scope == q.scope) &&
		(q.protocol == 0 || stored.protocol == q.protocol) &&
		(q.typ == 0 || stored.typ == q.typ) &&
		(q.link == 0 || stored.link == q.link) &&
		(!q.gw.IsValid() || stored.gw == q.gw)
}

func (f *Netlink) RouteDel(r *netlink.Route) error {
	q, err := toFakeRoute("ip route del", r)
	if err != nil {
		return err
	}
	return deleteFirst(f, &f.routes, func(stored fakeRoute) bool { return matchesRouteDelete(stored, q) },
		fmt.Errorf("fake netlink: ip route del %s table %d: %w", q.dst, q.table, unix.ESRCH), kernel.RouteDeleted, q.family)
}

// routeFilters are the filterMask bits RouteListFiltered applies.
const routeFilters = netlink.RT_FILTER_TABLE | netlink.RT_FILTER_PROTOCOL | netlink.RT_FILTER_SCOPE |
	netlink.RT_FILTER_TYPE | netlink.RT_FILTER_TOS | netlink.RT_FILTER_OIF | netlink.RT_FILTER_GW | netlink.RT_FILTER_DST

func (r fakeRoute) route() netlink.Route {
	out := netlink.Route{
		Family: r.family, Table: r.table, Dst: netipx.PrefixIPNet(r.dst), Tos: r.tos, Priority: r.priority,
		LinkIndex: r.link, Protocol: r.protocol, Scope: r.scope, Type: r.typ,
	}
	if r.gw.IsValid() {
		out.Gw = r.gw.AsSlice()
	}
	return out
}

// RouteListFiltered lists the routes of family (0: all) as netlink.Handle
// does: those of the main table only, unless the filter has a table
// (RT_TABLE_UNSPEC: all), sorted by table and destination.
func (f *Netlink) RouteListFiltered(family int, filter *netlink.Route, filterMask uint64) ([]netlink.Route, error) {
	if filter != nil && filterMask&^routeFilters != 0 {
		return nil, notModelled("ip route list", fmt.Sprintf("filter mask %#x", filterMask&^routeFilters))
	}
	if filter == nil {
		filterMask = 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netlink.Route
	for _, stored := range f.routes {
		r := stored.route()
		if family != 0 && r.Family != family {
			continue
		}
		if r.Table != unix.RT_TABLE_MAIN && filterMask&netlink.RT_FILTER_TABLE == 0 {
			continue
		}
		switch {
		case filterMask&netlink.RT_FILTER_TABLE != 0 && filter.Table != unix.RT_TABLE_UNSPEC && r.Table != filter.Table,
			filterMask&netlink.RT_FILTER_PROTOCOL != 0 && r.Protocol != filter.Protocol,
			filterMask&netlink.RT_FILTER_SCOPE != 0 && r.Scope != filter.Scope,
			filterMask&netlink.RT_FILTER_TYPE != 0 && r.Type != filter.Type,
			filterMask&netlink.RT_FILTER_TOS != 0 && r.Tos != filter.Tos,
			filterMask&netlink.RT_FILTER_OIF != 0 && r.LinkIndex != filter.LinkIndex,
			filterMask&netlink.RT_FILTER_GW != 0 && !r.Gw.Equal(filter.Gw),
			filterMask&netlink.RT_FILTER_DST != 0 && prefixOf(filter.Dst) != stored.dst:
			continue
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b netlink.Route) int {
		if c := cmp.Compare(a.Table, b.Table); c != 0 {
			return c
		}
		return prefixorder.Compare(prefixOf(a.Dst), prefixOf(b.Dst))
	})
	return out, nil
}
