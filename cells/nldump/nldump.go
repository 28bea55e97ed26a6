// Package nldump lists kernel objects over netlink whole. A dump that a
// concurrent change interrupts (NLM_F_DUMP_INTR: vishvananda/netlink's
// ErrDumpInterrupted) may have skipped or doubled objects; netlink returns
// it with the error. Acting on it could prune what is still there (a
// policy program detached, a rule deleted), so a dump is run again until
// one is consistent, and after Attempts an error is returned, never the
// partial list: the caller keeps its last good state and tries later.
//
// It is the one place enimasq's packages list links, routes, rules,
// qdiscs and filters, as Cilium's lint requires of its own (and unlike
// containernetworking's netlinksafe, which hands back the inconsistent
// list after its retries).
package nldump

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// Attempts is how many times a dump is run before an interrupted one is an
// error. Each interrupted dump means the kernel's objects changed during
// it; a busy node's route table settles within a few.
const Attempts = 20

// List runs list until a dump is not interrupted.
func List[T any](what string, list func() ([]T, error)) ([]T, error) {
	var err error
	for range Attempts {
		var out []T
		out, err = list()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			if err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("%s: interrupted by concurrent changes %d times: %w", what, Attempts, err)
}

// Links lists the links of the calling thread's netns.
func Links() ([]netlink.Link, error) {
	return List("ip link list", netlink.LinkList)
}

// RoutesFiltered lists the routes that netlink.RouteListFiltered selects.
func RoutesFiltered(family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	return List("ip route list", func() ([]netlink.Route, error) { return netlink.RouteListFiltered(family, filter, mask) })
}

// Rules lists the rules of a family.
func Rules(family int) ([]netlink.Rule, error) {
	return List("ip rule list", func() ([]netlink.Rule, error) { return netlink.RuleList(family) })
}

// Addrs lists the addresses of a link (nil: every link).
func Addrs(link netlink.Link, family int) ([]netlink.Addr, error) {
	return List("ip addr list", func() ([]netlink.Addr, error) { return netlink.AddrList(link, family) })
}

// Qdiscs lists the qdiscs of a link.
func Qdiscs(link netlink.Link) ([]netlink.Qdisc, error) {
	return List("tc qdisc list", func() ([]netlink.Qdisc, error) { return netlink.QdiscList(link) })
}

// Filters lists the tc filters of a link under parent.
func Filters(link netlink.Link, parent uint32) ([]netlink.Filter, error) {
	return List("tc filter list", func() ([]netlink.Filter, error) { return netlink.FilterList(link, parent) })
}

// LinkByName finds a link by name. It is not a dump in the kernel, but
// netlink's LinkByName falls back to one (a link list) where the kernel
// cannot look names up, and that one can be interrupted.
func LinkByName(name string) (netlink.Link, error) {
	var l netlink.Link
	_, err := List("ip link show "+name, func() ([]netlink.Link, error) {
		var err error
		l, err = netlink.LinkByName(name)
		return nil, err
	})
	return l, err
}
