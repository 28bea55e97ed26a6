package datapath

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/netip"

	"go4.org/netipx"

	"github.com/enimasq/enimasq/cells/nldump"

	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// routeOps reconciles eni-routes with the routes of the ENI tables.
type routeOps struct {
	nl *nlHandle
}

// linkByMAC finds the ENI's link. Links are listed every time: an ENI
// attached later (or re-attached with another index) is found.
func (o *routeOps) linkByMAC(mac string) (netlink.Link, error) {
	links, err := nldump.List("ip link list", o.nl.LinkList)
	if err != nil {
		return nil, fmt.Errorf("ip link list: %w", err)
	}
	for _, l := range links {
		if l.Attrs().HardwareAddr.String() == mac {
			return l, nil
		}
	}
	return nil, fmt.Errorf("no link with MAC %s", mac)
}

func (o *routeOps) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, r *Route) error {
	link, err := o.linkByMAC(r.MAC)
	if err != nil {
		return fmt.Errorf("ENI %s: %w (is the ENI attached?)", r.ENI, err)
	}
	nr := &netlink.Route{
		Family:    r.Family(),
		Table:     r.Table,
		Dst:       netipx.PrefixIPNet(r.Dst),
		LinkIndex: link.Attrs().Index,
		Protocol:  RTProto,
		Scope:     netlink.SCOPE_UNIVERSE,
	}
	if r.Gateway.IsValid() {
		nr.Gw = r.Gateway.AsSlice()
	} else {
		nr.Scope = netlink.SCOPE_LINK
	}
	if err := o.nl.RouteReplace(nr); err != nil {
		return fmt.Errorf("ip route replace %s dev %s table %d: %w", routeDst(r.Dst), link.Attrs().Name, r.Table, err)
	}
	return nil
}

// heldAs says whether the kernel route kr (of r's key, with enimasq's
// protocol) is r as routeOps.Update writes it on the link with index link:
// the same link, gateway and scope.
func (r *Route) heldAs(kr *netlink.Route, link int) bool {
	gw, _ := netip.AddrFromSlice(kr.Gw)
	scope := netlink.SCOPE_UNIVERSE
	if !r.Gateway.IsValid() {
		scope = netlink.SCOPE_LINK
	}
	return kr.LinkIndex == link && gw.Unmap() == r.Gateway && kr.Scope == scope
}

// deleteRoute deletes the route of the key with enimasq's protocol, in any
// scope and on any link.
func (o *routeOps) deleteRoute(k RouteKey) error {
	err := o.nl.RouteDel(&netlink.Route{
		Family:   addrFamily(k.Dst.Addr()),
		Table:    k.Table,
		Dst:      netipx.PrefixIPNet(k.Dst),
		Protocol: RTProto,
		Scope:    netlink.SCOPE_NOWHERE,
	})
	if err == nil || isGone(err) {
		return nil
	}
	return fmt.Errorf("ip route del %s table %d proto %d: %w", routeDst(k.Dst), k.Table, RTProto, err)
}

func (o *routeOps) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, r *Route) error {
	return o.deleteRoute(r.RouteKey)
}

// ListRoutes returns the kernel's routes with enimasq's protocol, in every
// table.
func ListRoutes(nl Netlink, families []int) ([]netlink.Route, error) {
	var out []netlink.Route
	for _, fam := range families {
		routes, err := nldump.List("ip route list", func() ([]netlink.Route, error) {
			return nl.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC, Protocol: RTProto},
				netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		})
		if err != nil {
			return nil, fmt.Errorf("ip route list: %w", err)
		}
		out = append(out, routes...)
	}
	return out, nil
}

func routeKeyOf(r *netlink.Route) RouteKey {
	dst := fromIPNet(r.Dst)
	if !dst.IsValid() {
		// The default route has no RTA_DST.
		if r.Family == unix.AF_INET6 {
			dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		} else {
			dst = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		}
	}
	return RouteKey{Table: r.Table, Dst: dst}
}

// Prune deletes the routes with enimasq's protocol that no row desires.
func (o *routeOps) Prune(_ context.Context, _ statedb.ReadTxn, objects iter.Seq2[*Route, statedb.Revision]) error {
	desired := map[RouteKey]bool{}
	for r := range objects {
		desired[r.RouteKey] = true
	}
	routes, err := ListRoutes(o.nl, o.nl.families)
	if err != nil {
		return err
	}
	var errs []error
	for i := range routes {
		k := routeKeyOf(&routes[i])
		if desired[k] {
			continue
		}
		if err := o.deleteRoute(k); err != nil {
			errs = append(errs, fmt.Errorf("prune: %w", err))
		}
	}
	return errors.Join(errs...)
}
