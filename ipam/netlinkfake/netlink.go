package netlinkfake

import (
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/kernel"
	"github.com/enimasq/enimasq/ipam/datapath"
)

// Netlink is an in-memory network namespace for tests without root: it
// implements datapath.Netlink and kernel.Source with the kernel's semantics that
// the reconcilers and the repair rely on, checked against kernel 6.18:
//
//   - ip rules (rules.go): the kernel's default rules; EEXIST on a
//     duplicate add, where the kernel compares the source, destination and
//     TOS only if the new rule has them and every other selector exactly;
//     a delete matches the first rule (in list order) that agrees on the
//     selectors it gives, and fails with ENOENT if none does; rules are
//     listed by priority, then in insertion order; a rule without a
//     priority gets the kernel's default one.
//   - routes (routes.go): keyed by family, table, destination, TOS and
//     priority; RouteReplace adds or replaces the route of its key, and
//     needs its link, and for a gateway a route of a narrower scope that
//     reaches it (in the route's table, else main), as the kernel does
//     (else ENODEV, ENETUNREACH); a delete matches the route of its
//     destination on the attributes it gives (scope unless
//     RT_SCOPE_NOWHERE), and fails with ESRCH if none does; listing
//     applies the filters as netlink's RouteListFiltered does.
//   - links: lo, and up links with a name and a MAC (listed as veth);
//     deleting a link deletes its routes.
//   - notifications (changes.go): every successful change is
//     delivered to the subscriptions of its kind and family, in order;
//     like the kernel, a deleted link's IPv4 routes go without
//     kernel.RouteDeleted. It is a kernel.Source: cells/kernel keeps
//     its tables from it as from the kernel.
//
// It does not model: addresses and the local and main tables' own routes,
// rule actions other than lookup, the rule selectors goto, flow, tun_id,
// port ranges, ip_proto, uid ranges, suppress_* and invert, multipath,
// encapsulation and MPLS routes, route metrics, link state changes (links
// are always up) and lost notifications. Operations that need what is not
// modelled fail with EOPNOTSUPP rather than guess.
type Netlink struct {
	mu        sync.Mutex
	rules     []fakeRule  // by priority, then insertion order
	routes    []fakeRoute // insertion order
	links     []fakeLink  // by index
	nextIndex int
	subs      map[*fakeSubscription]struct{}
}

var (
	_ datapath.Netlink = (*Netlink)(nil)
	_ kernel.Source    = (*Netlink)(nil)
)

type fakeLink struct {
	index    int
	name     string
	mac      net.HardwareAddr
	loopback bool
}

// New returns a fake namespace as a new one is: lo (index 1),
// the kernel's default rules, no routes of its own.
func New() *Netlink {
	f := &Netlink{
		links:     []fakeLink{{index: 1, name: "lo", loopback: true}},
		nextIndex: 2,
		subs:      map[*fakeSubscription]struct{}{},
	}
	f.rules = defaultRules()
	return f
}

// Target is the datapath.NetlinkTarget that makes the ipam cell program f
// and repair from the kernel tables: provide f as the hive's kernel.Source
// too (Cells does both).
func (f *Netlink) Target() *datapath.NetlinkTarget {
	return &datapath.NetlinkTarget{Handle: f, Repair: true}
}

// Cells make the hive's kernel f: the ipam cell programs it (Target) and
// cells/kernel reads it (a kernel.Source).
func (f *Netlink) Cells() cell.Cell {
	return cell.Provide(f.Target, func() kernel.Source { return f })
}

// AddrList lists no address: addresses are not modelled.
func (f *Netlink) AddrList(netlink.Link, int) ([]netlink.Addr, error) { return nil, nil }

// AddLink adds an up link with the name and MAC, as `ip link add` of a
// veth would (without its peer). The index is never reused.
func (f *Netlink) AddLink(name string, mac net.HardwareAddr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if slices.ContainsFunc(f.links, func(l fakeLink) bool { return l.name == name }) {
		return fmt.Errorf("fake netlink: add link %s: %w", name, unix.EEXIST)
	}
	f.links = append(f.links, fakeLink{index: f.nextIndex, name: name, mac: slices.Clone(mac)})
	f.nextIndex++
	f.emit(kernel.LinkChanged, 0)
	return nil
}

// DelLink deletes a link and the routes through it.
func (f *Netlink) DelLink(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.links, func(l fakeLink) bool { return l.name == name })
	switch {
	case i < 0:
		return fmt.Errorf("fake netlink: delete link %s: %w", name, unix.ENODEV)
	case f.links[i].loopback:
		return fmt.Errorf("fake netlink: delete link %s: %w", name, unix.EOPNOTSUPP)
	}
	index := f.links[i].index
	f.links = slices.Delete(f.links, i, i+1)
	f.routes = slices.DeleteFunc(f.routes, func(r fakeRoute) bool {
		if r.link != index {
			return false
		}
		if r.family == unix.AF_INET6 {
			// The kernel announces these; not the IPv4 ones.
			f.emit(kernel.RouteDeleted, r.family)
		}
		return true
	})
	f.emit(kernel.LinkDeleted, 0)
	return nil
}

func (f *Netlink) LinkList() ([]netlink.Link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]netlink.Link, 0, len(f.links))
	for _, l := range f.links {
		attrs := netlink.NewLinkAttrs()
		attrs.Index = l.index
		attrs.Name = l.name
		attrs.HardwareAddr = slices.Clone(l.mac)
		attrs.OperState = netlink.OperUp
		if l.loopback {
			attrs.MTU = 65536
			attrs.Flags = net.FlagUp | net.FlagLoopback
			out = append(out, &netlink.Device{LinkAttrs: attrs})
			continue
		}
		attrs.MTU = 1500
		attrs.Flags = net.FlagUp | net.FlagBroadcast | net.FlagMulticast
		out = append(out, &netlink.Veth{LinkAttrs: attrs})
	}
	return out, nil
}

func (f *Netlink) linkExists(index int) bool {
	return slices.ContainsFunc(f.links, func(l fakeLink) bool { return l.index == index })
}

// notModelled is the error of an operation that needs what the fake does
// not model.
func notModelled(op, what string) error {
	return fmt.Errorf("fake netlink: %s: %s is not modelled: %w", op, what, unix.EOPNOTSUPP)
}
