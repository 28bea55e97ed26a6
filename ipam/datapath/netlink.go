package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"go4.org/netipx"

	"github.com/enimasq/enimasq/cells/nldump"

	"github.com/cilium/hive/cell"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RTProto is the netlink protocol number enimasq's own ip rules and routes
// carry (nodeconfig.EnimasqPodRules.Protocol) (`ip rule` shows "proto 237"). Pruning deletes only rules and routes
// with this number, so rules of aws-node, Cilium (proto kernel), an operator
// (proto boot/static) or routing daemons are never touched.
//
// 237 is not named in /etc/iproute2/rt_protos, not an RTPROT_* value of the
// kernel (those end at 192, eigrp), above RTPROT_STATIC (so the kernel does
// not interpret it), and not used by the CNIs found on EKS nodes (Cilium 2,
// Calico 80, aws-node 3/unspec). Documentation/eni-ipam.md shows how to
// name it in /etc/iproute2/rt_protos.d.
const RTProto = 237

// Netlink is the part of *netlink.Handle the reconcilers use. A
// *netlink.Handle implements it; tests wrap one to count operations.
type Netlink interface {
	RuleAdd(*netlink.Rule) error
	RuleDel(*netlink.Rule) error
	RuleList(family int) ([]netlink.Rule, error)
	RouteReplace(*netlink.Route) error
	RouteDel(*netlink.Route) error
	RouteListFiltered(family int, filter *netlink.Route, filterMask uint64) ([]netlink.Route, error)
	LinkList() ([]netlink.Link, error)
}

var _ Netlink = (*netlink.Handle)(nil)

// NetlinkTarget makes the cell program another network namespace than the
// process's own: tests and benchmarks provide it with a handle created by
// netlink.NewHandleAt on a fresh namespace, or with a netlinkfake.Netlink
// (netlinkfake.Netlink.Target). An agent does not provide it.
type NetlinkTarget struct {
	Handle Netlink
	// Repair says that the kernel tables (cells/kernel) are those of
	// Handle's namespace (the hive's kernel.Source is the same fake, or
	// its *netns.NsHandle the same namespace): the repair follows them.
	// False: none is done, the refresh repairs.
	Repair bool
}

// nlHandle is the handle the cell's operations and script commands use.
type nlHandle struct {
	Netlink
	families []int
	// repair says whether the kernel tables are of the handle's
	// namespace, and the repair may follow them.
	repair bool
}

type netlinkParams struct {
	cell.In

	Lifecycle cell.Lifecycle
	Settings  Settings
	Target    *NetlinkTarget `optional:"true"`
}

// newNetlink opens a netlink handle on the process's network namespace
// (/proc/self/ns/net: the namespace of the process, whatever thread runs
// this), unless a NetlinkTarget is provided.
func newNetlink(p netlinkParams) (*nlHandle, error) {
	var fams []int
	if p.Settings.EnableIPv4 {
		fams = append(fams, unix.AF_INET)
	}
	if p.Settings.EnableIPv6 {
		fams = append(fams, unix.AF_INET6)
	}
	if p.Target != nil {
		return &nlHandle{Netlink: p.Target.Handle, families: fams, repair: p.Target.Repair}, nil
	}
	ns, err := netns.GetFromPath("/proc/self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("network namespace of the agent: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	p.Lifecycle.Append(cell.Hook{OnStop: func(cell.HookContext) error { h.Close(); return nil }})
	return &nlHandle{Netlink: h, families: fams, repair: true}, nil
}

// fromIPNet is the prefix of a netlink selector, zero for none (IPv4
// written as IPv4-mapped IPv6 comes back as IPv4).
func fromIPNet(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	p, _ := netipx.FromStdIPNet(n)
	return p
}

func isGone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH)
}

// netlinkRule is the kernel rule of a key: only priority, selectors, table
// and protocol are set.
func netlinkRule(k RuleKey, family, protocol int) *netlink.Rule {
	r := netlink.NewRule()
	r.Priority = k.Priority
	r.Family = family
	r.Table = k.Table
	r.Protocol = uint8(protocol)
	if k.From.IsValid() {
		r.Src = netipx.PrefixIPNet(k.From)
	}
	if k.To.IsValid() {
		r.Dst = netipx.PrefixIPNet(k.To)
	}
	return r
}

// ruleKeyOf is the key of a kernel rule, and whether the rule has nothing
// else (a rule with a mark or an interface is never one of ours in shape).
func ruleKeyOf(r *netlink.Rule) (RuleKey, bool) {
	k := RuleKey{Priority: r.Priority, From: fromIPNet(r.Src), To: fromIPNet(r.Dst), Table: r.Table}
	if k.From.IsValid() && k.From.Bits() == 0 {
		k.From = netip.Prefix{}
	}
	if k.To.IsValid() && k.To.Bits() == 0 {
		k.To = netip.Prefix{}
	}
	plain := r.Mark == 0 && r.Mask == nil && r.Tos == 0 && r.TunID == 0 && r.Goto < 0 && r.Flow <= 0 &&
		r.IifName == "" && r.OifName == "" && !r.Invert && r.Dport == nil && r.Sport == nil &&
		r.IPProto == 0 && r.UIDRange == nil && r.SuppressIfgroup <= 0 && r.SuppressPrefixlen <= 0
	return k, plain
}

// ListRules returns the kernel's rules with enimasq's protocol, sorted by
// priority (the kernel's order within a priority is kept).
func ListRules(nl Netlink, families []int) ([]netlink.Rule, error) {
	return listRules(nl, families, func(r *netlink.Rule) bool { return r.Protocol == RTProto })
}

func listRules(nl Netlink, families []int, owned func(*netlink.Rule) bool) ([]netlink.Rule, error) {
	var out []netlink.Rule
	for _, fam := range families {
		rules, err := nldump.List("ip rule list", func() ([]netlink.Rule, error) { return nl.RuleList(fam) })
		if err != nil {
			return nil, fmt.Errorf("ip rule list: %w", err)
		}
		for i := range rules {
			if owned(&rules[i]) {
				out = append(out, rules[i])
			}
		}
	}
	slices.SortStableFunc(out, func(a, b netlink.Rule) int { return a.Priority - b.Priority })
	return out, nil
}
