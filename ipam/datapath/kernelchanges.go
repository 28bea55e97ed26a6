package datapath

import (
	"context"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// kernelChanges subscribes to the kernel's rtnetlink notifications in a
// network namespace (ns nil: the process's).
type kernelChanges struct {
	ns *netns.NsHandle
}

// changeGroups are the rtnetlink multicast groups of the rules of families
// and, with routes, of their routes and of links.
func changeGroups(families []int, routes bool) []uint {
	groups := []uint{}
	for _, fam := range families {
		if fam == unix.AF_INET {
			groups = append(groups, unix.RTNLGRP_IPV4_RULE)
			if routes {
				groups = append(groups, unix.RTNLGRP_IPV4_ROUTE)
			}
		} else {
			groups = append(groups, unix.RTNLGRP_IPV6_RULE)
			if routes {
				groups = append(groups, unix.RTNLGRP_IPV6_ROUTE)
			}
		}
	}
	if routes {
		groups = append(groups, unix.RTNLGRP_LINK)
	}
	return groups
}

func (k kernelChanges) SubscribeChanges(families []int, routes bool) (NetlinkSubscription, error) {
	groups := changeGroups(families, routes)
	var (
		sock *nl.NetlinkSocket
		err  error
	)
	if k.ns != nil {
		sock, err = nl.SubscribeAt(*k.ns, netns.None(), unix.NETLINK_ROUTE, groups...)
	} else {
		sock, err = nl.Subscribe(unix.NETLINK_ROUTE, groups...)
	}
	if err != nil {
		return nil, fmt.Errorf("subscribe to rtnetlink groups %v: %w", groups, err)
	}
	// A receive timeout lets the reader see the end of its context: 40 ms,
	// so that the job stops well within the lifecycle's log threshold of
	// 100 ms (infra.LogThreshold; at 100 ms its stop hook was logged at
	// INFO now and then).
	if err := sock.SetReceiveTimeout(&unix.Timeval{Usec: 40_000}); err != nil {
		sock.Close()
		return nil, fmt.Errorf("netlink socket receive timeout: %w", err)
	}
	return &kernelSubscription{sock: sock}, nil
}

// kernelSubscription reads one netlink socket.
type kernelSubscription struct {
	sock *nl.NetlinkSocket
}

// changeOfMessage maps an rtnetlink message type to its change, if it is
// one of the kinds the repair knows.
var changeOfMessage = map[uint16]NetlinkChange{
	unix.RTM_NEWRULE:  RuleAdded,
	unix.RTM_DELRULE:  RuleDeleted,
	unix.RTM_NEWROUTE: RouteAdded,
	unix.RTM_DELROUTE: RouteDeleted,
	unix.RTM_NEWLINK:  LinkChanged,
	unix.RTM_DELLINK:  LinkDeleted,
}

func (s *kernelSubscription) Receive(ctx context.Context) ([]NetlinkChange, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		msgs, _, err := s.sock.Receive()
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EWOULDBLOCK) || errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.ENOBUFS) {
				return []NetlinkChange{ChangesLost}, nil
			}
			return nil, fmt.Errorf("netlink notification socket: %w", err)
		}
		var changes []NetlinkChange
		for _, m := range msgs {
			if c, ok := changeOfMessage[m.Header.Type]; ok {
				changes = append(changes, c)
			}
		}
		if len(changes) > 0 {
			return changes, nil
		}
	}
}

func (s *kernelSubscription) Close() error {
	s.sock.Close()
	return nil
}

// KernelChanges is the kernel's notifications in the network namespace ns
// (nil: the process's), as a NetlinkChanges.
func KernelChanges(ns *netns.NsHandle) NetlinkChanges { return kernelChanges{ns: ns} }
