package main

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/enimasq/enimasq/cells/nldump"
	"github.com/enimasq/enimasq/ipam/ipamapi"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The host veth's name has no network in it: the same container and
// interface in two networks is one name. Network B's DEL after a failed ADD
// of B (the interface exists: network A holds it) must not remove A's live
// veth. So a DEL or GC removes a host veth only when it is provably its
// network's attachment's:
//
//   - it routes (the node's /32 or /128 route via the link, as ADD makes) an
//     IP that the agent says this network's attachment holds; or
//   - the runtime's prevResult of this network's attachment (the result of
//     its ADD) names it, with the MAC the link has: a veth made again since
//     has another MAC.
//
// Anything else is left: another network's, or one a failed ADD of this
// network did not get to route (it goes with the pod's netns).

// podRoutes maps the node's routes to single addresses (the pods' routes,
// as ADD makes them) to the indexes of the links they go via.
type podRoutes map[netip.Addr][]int

// nodePodRoutes lists the node's routes to single addresses in the main
// table.
func nodePodRoutes() (podRoutes, error) {
	routes, err := nldump.RoutesFiltered(netlink.FAMILY_ALL, &netlink.Route{}, 0)
	if err != nil {
		return nil, fmt.Errorf("list the node's routes: %w", err)
	}
	out := podRoutes{}
	for _, r := range routes {
		if r.Dst == nil || r.LinkIndex <= 0 {
			continue
		}
		if ones, bits := r.Dst.Mask.Size(); ones != bits {
			continue
		}
		if addr, ok := netip.AddrFromSlice(r.Dst.IP); ok {
			addr = addr.Unmap()
			out[addr] = append(out[addr], r.LinkIndex)
		}
	}
	return out, nil
}

// routesAny says whether one of ips is routed via the link with index.
func (p podRoutes) routesAny(index int, ips []string) bool {
	for _, s := range ips {
		addr, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		for _, i := range p[addr.Unmap()] {
			if i == index {
				return true
			}
		}
	}
	return false
}

// namedByResult says whether a CNI result names the host-side interface
// name with mac (the host side has no sandbox).
func namedByResult(prev *current.Result, name, mac string) bool {
	if prev == nil || mac == "" {
		return false
	}
	for _, i := range prev.Interfaces {
		if i != nil && i.Sandbox == "" && i.Name == name && strings.EqualFold(i.Mac, mac) {
			return true
		}
	}
	return false
}

// prevResultOf is the network configuration's prevResult (the runtime's
// cached result of the attachment's ADD), or nil.
func prevResultOf(conf *NetConf) *current.Result {
	if conf.PrevResult == nil {
		return nil
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return nil
	}
	return prev
}

// ownedVeth is a host veth that is provably an attachment's.
type ownedVeth struct {
	link netlink.Link
	why  string
}

// ownedVeths returns the host veths of the attachment (its name, and the
// name of a veth made when it was named after the container alone) that
// route one of the IPs the agent says the attachment holds (held), or that
// prev names with their MAC. routes is the node's pod routes from before
// the IPs were released.
func ownedVeths(att ipamapi.Attachment, held []string, prev *current.Result, routes podRoutes) ([]ownedVeth, error) {
	var out []ownedVeth
	for _, name := range []string{hostVethName(att), legacyHostVethName(att.ContainerID)} {
		link, err := nldump.LinkByName(name)
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("host veth %s: %w", name, err)
		}
		switch {
		case routes.routesAny(link.Attrs().Index, held):
			out = append(out, ownedVeth{link, "it routes the attachment's IP"})
		case namedByResult(prev, name, link.Attrs().HardwareAddr.String()):
			out = append(out, ownedVeth{link, "the attachment's prevResult names it"})
		}
	}
	return out, nil
}

// removeVeths removes the veths (the link itself, by index: not another one
// made since under the name); one gone already is fine.
func removeVeths(veths []ownedVeth) error {
	var errs []error
	for _, v := range veths {
		if err := netlink.LinkDel(v.link); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("remove veth %s (%s): %w", v.link.Attrs().Name, v.why, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, "enimasq-cni: remove veth", err.Error())
	}
	return nil
}

// ips returns the IPs of allocations.
func ips(list []ipamapi.AllocationInfo) []string {
	out := make([]string, 0, len(list))
	for _, a := range list {
		out = append(out, a.IP)
	}
	return out
}
