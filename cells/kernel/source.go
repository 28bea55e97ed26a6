package kernel

import (
	"context"

	"github.com/vishvananda/netlink"
)

// Source is where the cell reads the kernel: one subscription to its
// notifications and the dumps it resyncs from. The kernel's is
// a *Netlink (a network namespace); tests without root give a fake
// (ipam/netlinkfake), which delivers the same changes for the same
// operations.
type Source interface {
	// Subscribe starts the notifications of groups. Once it has returned,
	// no change goes unseen.
	Subscribe(groups Groups) (Subscription, error)
	LinkList() ([]netlink.Link, error)
	// AddrList lists the addresses of a link (nil: every link).
	AddrList(link netlink.Link, family int) ([]netlink.Addr, error)
	RouteListFiltered(family int, filter *netlink.Route, filterMask uint64) ([]netlink.Route, error)
	RuleList(family int) ([]netlink.Rule, error)
}

// Groups selects the notifications of a subscription.
type Groups struct {
	// Families are the families of the rules (and, with Routes and
	// Addrs, of the routes and addresses) to hear of.
	Families []int
	// Routes adds the routes of Families and the links.
	Routes bool
	// Addrs adds the addresses of Families.
	Addrs bool
}

// Subscription delivers the changes of one subscription.
type Subscription interface {
	// Receive waits for changes and returns them in order. It returns
	// ctx's error once ctx ends, and another error when no more changes
	// can come.
	Receive(ctx context.Context) ([]Change, error)
	Close() error
}

// Change is the kind of one change notification.
type Change int

const (
	// RuleAdded is RTM_NEWRULE.
	RuleAdded Change = iota + 1
	// RuleDeleted is RTM_DELRULE.
	RuleDeleted
	// RouteAdded is RTM_NEWROUTE (an add or a replace).
	RouteAdded
	// RouteDeleted is RTM_DELROUTE. The kernel sends none for the IPv4
	// routes a deleted link takes with it.
	RouteDeleted
	// LinkChanged is RTM_NEWLINK: a link added or changed.
	LinkChanged
	// LinkDeleted is RTM_DELLINK.
	LinkDeleted
	// AddrAdded is RTM_NEWADDR.
	AddrAdded
	// AddrDeleted is RTM_DELADDR.
	AddrDeleted
	// ChangesLost says notifications were dropped (ENOBUFS on the
	// socket): anything may have changed.
	ChangesLost
)

func (c Change) String() string {
	switch c {
	case RuleAdded:
		return "rule-added"
	case RuleDeleted:
		return "rule-deleted"
	case RouteAdded:
		return "route-added"
	case RouteDeleted:
		return "route-deleted"
	case LinkChanged:
		return "link-changed"
	case LinkDeleted:
		return "link-deleted"
	case AddrAdded:
		return "addr-added"
	case AddrDeleted:
		return "addr-deleted"
	case ChangesLost:
		return "changes-lost"
	}
	return "unknown"
}

// kinds are the tables a change makes stale. A link that changes or goes
// takes routes (and addresses) with it without a notification of their
// own: its routes and addresses are listed again too.
func (c Change) kinds() kindSet {
	switch c {
	case RuleAdded, RuleDeleted:
		return kindRules
	case RouteAdded, RouteDeleted:
		return kindRoutes
	case LinkChanged, LinkDeleted:
		return kindLinks | kindRoutes | kindAddrs
	case AddrAdded, AddrDeleted:
		return kindAddrs
	}
	return allKinds
}
