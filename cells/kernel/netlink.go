package kernel

import (
	"context"
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Netlink is the kernel of a network namespace: a netlink handle for
// the dumps, and a multicast socket per subscription.
type Netlink struct {
	*netlink.Handle
	ns *netns.NsHandle // nil: the process's
}

// NewNetlink is the kernel of the network namespace ns (nil: the
// process's, /proc/self/ns/net, whatever thread runs this). Close (the
// handle's) releases it.
func NewNetlink(ns *netns.NsHandle) (*Netlink, error) {
	var (
		h   *netlink.Handle
		err error
	)
	if ns != nil {
		h, err = netlink.NewHandleAt(*ns, unix.NETLINK_ROUTE)
	} else {
		h, err = agentHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	return &Netlink{Handle: h, ns: ns}, nil
}

// groupsOf are the rtnetlink multicast groups of g.
func groupsOf(g Groups) []uint {
	groups := []uint{}
	for _, fam := range g.Families {
		if fam == unix.AF_INET {
			groups = append(groups, unix.RTNLGRP_IPV4_RULE)
			if g.Routes {
				groups = append(groups, unix.RTNLGRP_IPV4_ROUTE)
			}
			if g.Addrs {
				groups = append(groups, unix.RTNLGRP_IPV4_IFADDR)
			}
		} else {
			groups = append(groups, unix.RTNLGRP_IPV6_RULE)
			if g.Routes {
				groups = append(groups, unix.RTNLGRP_IPV6_ROUTE)
			}
			if g.Addrs {
				groups = append(groups, unix.RTNLGRP_IPV6_IFADDR)
			}
		}
	}
	if g.Routes {
		groups = append(groups, unix.RTNLGRP_LINK)
	}
	return groups
}

func (s *Netlink) Subscribe(g Groups) (Subscription, error) {
	groups := groupsOf(g)
	var (
		sock *nl.NetlinkSocket
		err  error
	)
	if s.ns != nil {
		sock, err = nl.SubscribeAt(*s.ns, netns.None(), unix.NETLINK_ROUTE, groups...)
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

// changeOfMessage maps an rtnetlink message type to its change.
var changeOfMessage = map[uint16]Change{
	unix.RTM_NEWRULE:  RuleAdded,
	unix.RTM_DELRULE:  RuleDeleted,
	unix.RTM_NEWROUTE: RouteAdded,
	unix.RTM_DELROUTE: RouteDeleted,
	unix.RTM_NEWLINK:  LinkChanged,
	unix.RTM_DELLINK:  LinkDeleted,
	unix.RTM_NEWADDR:  AddrAdded,
	unix.RTM_DELADDR:  AddrDeleted,
}

func (s *kernelSubscription) Receive(ctx context.Context) ([]Change, error) {
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
				return []Change{ChangesLost}, nil
			}
			return nil, fmt.Errorf("netlink notification socket: %w", err)
		}
		var changes []Change
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

// agentHandle is a handle in the agent's network namespace (the process's,
// not this thread's, should a test have moved it). Entering a namespace
// takes CAP_SYS_ADMIN even when it is the current one, so a thread already
// there opens its sockets where it is: the agent needs no capability to
// read its own namespace.
func agentHandle() (*netlink.Handle, error) {
	self, err := netns.GetFromPath("/proc/self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("network namespace of the agent: %w", err)
	}
	defer self.Close()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cur, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("network namespace of this thread: %w", err)
	}
	defer cur.Close()
	if cur.Equal(self) {
		return netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	return netlink.NewHandleAt(self, unix.NETLINK_ROUTE)
}
