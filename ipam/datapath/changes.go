package datapath

import "context"

// The repair of rules and routes deleted behind enimasq's back (ruleRepair,
// kernelevents.go) acts on change notifications. In an agent they are the
// kernel's rtnetlink multicast messages; in tests without root they come
// from a netlinkfake.Netlink, which emits the same kinds for the same operations.
// NetlinkChanges is the seam between the two, so the repair logic runs
// unchanged on either.

// NetlinkChange is the kind of one change notification.
type NetlinkChange int

const (
	// RuleAdded is RTM_NEWRULE.
	RuleAdded NetlinkChange = iota + 1
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
	// ChangesLost says notifications were dropped (ENOBUFS on the
	// socket): anything may have changed.
	ChangesLost
)

func (c NetlinkChange) String() string {
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
	case ChangesLost:
		return "changes-lost"
	}
	return "unknown"
}

// NetlinkChanges is a source of change notifications: the kernel's
// (kernelChanges) or a fake's (ipam/netlinkfake).
type NetlinkChanges interface {
	// SubscribeChanges starts the notifications of the rules of families
	// and, with routes, of their routes and of the links. Once it has
	// returned, no change goes unseen.
	SubscribeChanges(families []int, routes bool) (NetlinkSubscription, error)
}

// NetlinkSubscription delivers the changes of one subscription.
type NetlinkSubscription interface {
	// Receive waits for changes and returns them in order. It returns
	// ctx's error once ctx ends, and another error when no more changes
	// can come.
	Receive(ctx context.Context) ([]NetlinkChange, error)
	Close() error
}
