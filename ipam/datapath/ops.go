package datapath

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net"
	"net/netip"
	"slices"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
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
	// NS is the namespace of Handle, for the kernel's notifications (nil,
	// and no Changes: none are listened to, the refresh repairs).
	NS *netns.NsHandle
	// Changes, if set, delivers the notifications of Handle's changes
	// instead of the kernel (a netlinkfake.Netlink).
	Changes NetlinkChanges
}

// nlHandle is the handle the cell's operations and script commands use.
type nlHandle struct {
	Netlink
	families []int
	// changes are the notifications of the handle's rules, routes and
	// links (nil: none can be listened to).
	changes NetlinkChanges
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
		h := &nlHandle{Netlink: p.Target.Handle, families: fams, changes: p.Target.Changes}
		if h.changes == nil && p.Target.NS != nil {
			h.changes = kernelChanges{ns: p.Target.NS}
		}
		return h, nil
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
	return &nlHandle{Netlink: h, families: fams, changes: kernelChanges{}}, nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func fromIPNet(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	addr, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addr.Unmap(), ones)
}

func isGone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH)
}

// listAll retries a dump the kernel interrupted (a concurrent change).
func listAll[T any](list func() ([]T, error)) ([]T, error) {
	var err error
	for range 5 {
		var out []T
		out, err = list()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	return nil, err
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
		r.Src = ipNet(k.From)
	}
	if k.To.IsValid() {
		r.Dst = ipNet(k.To)
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
		rules, err := listAll(func() ([]netlink.Rule, error) { return nl.RuleList(fam) })
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

// ownsRule says whether a kernel rule is one that enimasq writes and may
// prune.
//
// With a protocol of its own, every rule with it is. A shared protocol
// (Cilium's pod rules carry RTPROT_KERNEL, as do the kernel's own rules 0:
// local, 32766: main, 32767: default, and other writers'): only a pod's
// egress rule in the pod shape is enimasq's to keep in step: the egress
// priority, from a single address, an ENI table, and no other selector.
func (s Settings) ownsRule(r *netlink.Rule) bool {
	if int(r.Protocol) != s.PodRules.Protocol {
		return false
	}
	if !s.SharedProtocol {
		return true
	}
	k, plain := ruleKeyOf(r)
	return plain && k.Priority == s.PodRules.EgressPriority &&
		k.From.IsValid() && k.From.IsSingleIP() &&
		k.Table >= s.PodRules.TableOffset && k.Table <= s.PodRules.TableOffset+ciliumnode.MaxENINumber
}

// ruleOps reconciles eni-rules with ip rules.
type ruleOps struct {
	nl       *nlHandle
	settings Settings
	rules    statedb.Table[*Rule]
}

func (o *ruleOps) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, r *Rule) error {
	err := o.nl.RuleAdd(netlinkRule(r.RuleKey, r.Family(), o.settings.PodRules.Protocol))
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("ip rule add %q: %w", r.IPRule(), err)
	}
	// EEXIST is not proof: the kernel compares only the selectors the new
	// rule has, so "from <pod> lookup 11" exists for it as soon as any rule
	// of that priority, source and table does, with a destination or not.
	present, blocking, err := o.exact(r.RuleKey, r.Family())
	switch {
	case err != nil:
		return err
	case present:
		return nil
	}
	// A rule of ours that no row desires (the pruning deletes it, then the
	// retry adds this one), or another writer's.
	return fmt.Errorf("ip rule add %q: the kernel takes %q for the same rule (a rule without a destination "+
		"matches every rule of its priority, source and table): not added until that one is gone", r.IPRule(), blocking)
}

// exact says whether the kernel holds exactly the rule of k, with our
// protocol; if not, blocking is a rule of the same priority, source and table.
func (o *ruleOps) exact(k RuleKey, family int) (present bool, blocking string, err error) {
	rules, err := listAll(func() ([]netlink.Rule, error) { return o.nl.RuleList(family) })
	if err != nil {
		return false, "", fmt.Errorf("ip rule list: %w", err)
	}
	for i := range rules {
		got, plain := ruleKeyOf(&rules[i])
		switch {
		case plain && got == k && int(rules[i].Protocol) == o.settings.PodRules.Protocol:
			return true, "", nil
		case got.Priority == k.Priority && got.From == k.From && got.Table == k.Table:
			blocking = formatRule(got)
		}
	}
	return false, blocking, nil
}

func (o *ruleOps) Delete(_ context.Context, txn statedb.ReadTxn, _ statedb.Revision, r *Rule) error {
	if !o.settings.IngressRules {
		if _, _, desired := o.rules.Get(txn, RulePodIndex.Query(r.Pod)); !desired {
			// No rule of the IP is desired any more: it is no longer
			// allocated. Its rules go once the CNI no longer routes to it:
			// Cilium removes an endpoint's ingress rule before it drops
			// the endpoint, so while the ingress rule is there the IP is
			// in use (a new pod that got the IP, its endpoint not created
			// yet). The delete fails and is retried with backoff
			// meanwhile, and health says why.
			alive, err := o.podRouted(r.Pod)
			if err != nil {
				return err
			}
			if alive {
				return fmt.Errorf("ip rule del %q: %s is no longer allocated, "+
					"but the CNI still routes to it (its priority-%d rule is in place): kept until that rule goes",
					r.IPRule(), r.Pod, o.settings.PodRules.IngressPriority)
			}
		}
	}
	err := o.nl.RuleDel(netlinkRule(r.RuleKey, r.Family(), o.settings.PodRules.Protocol))
	if err == nil || isGone(err) {
		return nil
	}
	return fmt.Errorf("ip rule del %q: %w", r.IPRule(), err)
}

// podRouted says whether the CNI's ingress rule of pod ("20:
// to <pod> lookup main", any protocol) is in the kernel.
func (o *ruleOps) podRouted(pod netip.Addr) (bool, error) {
	rules, err := listAll(func() ([]netlink.Rule, error) { return o.nl.RuleList(addrFamily(pod)) })
	if err != nil {
		return false, fmt.Errorf("ip rule list: %w", err)
	}
	return o.settings.routed(rules)[pod], nil
}

// routed are the IPs that have an ingress rule ("<prio>: to <ip> lookup
// main", any protocol) among rules.
func (s Settings) routed(rules []netlink.Rule) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for i := range rules {
		k, _ := ruleKeyOf(&rules[i])
		if k.Priority == s.PodRules.IngressPriority && k.Table == MainTable && !k.From.IsValid() && k.To.IsValid() && k.To.IsSingleIP() {
			out[k.To.Addr()] = true
		}
	}
	return out
}

// Prune deletes the kernel rules enimasq owns (ownsRule) that no row
// desires. Rules of any other protocol or shape are never looked at twice.
//
// When the ingress rules are the CNI's (Settings.IngressRules off), the
// owned rules are pruned for the IPs with desired rules, and for IPs the CNI
// no longer routes to (no ingress rule): what an endpoint's deletion, or a
// restart after an edit, left behind. An IP it routes to without desired
// rules (a pod between cilium-cni's ADD and its endpoint) keeps the rules
// cilium-cni wrote.
func (o *ruleOps) Prune(_ context.Context, _ statedb.ReadTxn, objects iter.Seq2[*Rule, statedb.Revision]) error {
	desired := map[RuleKey]bool{}
	desiredPods := map[netip.Addr]bool{}
	for r := range objects {
		desired[r.RuleKey] = true
		desiredPods[r.Pod] = true
	}
	var all []netlink.Rule
	for _, fam := range o.nl.families {
		rules, err := listAll(func() ([]netlink.Rule, error) { return o.nl.RuleList(fam) })
		if err != nil {
			return fmt.Errorf("ip rule list: %w", err)
		}
		all = append(all, rules...)
	}
	inScope := func(netip.Addr) bool { return true }
	if !o.settings.IngressRules {
		routed := o.settings.routed(all)
		inScope = func(ip netip.Addr) bool { return desiredPods[ip] || !routed[ip] }
	}
	rules := slices.DeleteFunc(all, func(r netlink.Rule) bool { return !o.settings.ownsRule(&r) })
	slices.SortStableFunc(rules, func(a, b netlink.Rule) int { return a.Priority - b.Priority })
	var (
		errs  []error
		loose []netlink.Rule // stale rules without a destination
	)
	for i := range rules {
		r := &rules[i]
		k, plain := ruleKeyOf(r)
		if plain && desired[k] {
			continue
		}
		if !inScope(k.From.Addr()) {
			continue
		}
		if !k.To.IsValid() {
			loose = append(loose, *r)
			continue
		}
		if err := o.nl.RuleDel(r); err != nil && !isGone(err) {
			errs = append(errs, fmt.Errorf("prune %s proto %d: %w", r, r.Protocol, err))
		}
	}
	// A delete without a destination removes the first rule of its
	// priority, source and table, which may be a desired rule with a
	// destination: delete, put back what went, and go on until the stale
	// rule itself is gone (the one put back goes after it).
	for i := range loose {
		errs = append(errs, o.pruneLoose(&loose[i], desired))
	}
	return errors.Join(errs...)
}

// pruneLoose deletes the stale rule r, which has no destination, re-adding
// the desired rules its deletes take instead.
func (o *ruleOps) pruneLoose(r *netlink.Rule, desired map[RuleKey]bool) error {
	stale, plain := ruleKeyOf(r)
	siblings := 0
	for k := range desired {
		if k.Priority == stale.Priority && k.From == stale.From && k.Table == stale.Table {
			siblings++
		}
	}
	// Each delete takes the first rule of the group; a sibling put back goes
	// after the stale rule, so siblings+1 deletes reach it.
	for range siblings + 2 {
		if err := o.nl.RuleDel(r); err != nil && !isGone(err) {
			return fmt.Errorf("prune %s proto %d: %w", r, r.Protocol, err)
		}
		if !plain {
			// A rule with another selector (a mark, an interface) is
			// matched by its delete exactly.
			return nil
		}
		rules, err := listAll(func() ([]netlink.Rule, error) { return o.nl.RuleList(r.Family) })
		if err != nil {
			return fmt.Errorf("ip rule list: %w", err)
		}
		present := map[RuleKey]bool{}
		for i := range rules {
			if k, plain := ruleKeyOf(&rules[i]); plain && int(rules[i].Protocol) == o.settings.PodRules.Protocol {
				present[k] = true
			}
		}
		for k := range desired {
			if k.Priority == stale.Priority && k.From == stale.From && k.Table == stale.Table && !present[k] {
				if err := o.nl.RuleAdd(netlinkRule(k, r.Family, o.settings.PodRules.Protocol)); err != nil && !errors.Is(err, unix.EEXIST) {
					return fmt.Errorf("re-add %q: %w", formatRule(k), err)
				}
			}
		}
		if !present[stale] {
			return nil
		}
	}
	return fmt.Errorf("prune %s: still in the kernel after %d deletes", formatRule(stale), siblings+2)
}

// routeOps reconciles eni-routes with the routes of the ENI tables.
type routeOps struct {
	nl *nlHandle
}

// linkByMAC finds the ENI's link. Links are listed every time: an ENI
// attached later (or re-attached with another index) is found.
func (o *routeOps) linkByMAC(mac string) (netlink.Link, error) {
	links, err := listAll(o.nl.LinkList)
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
		Dst:       ipNet(r.Dst),
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
		Dst:      ipNet(k.Dst),
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
		routes, err := listAll(func() ([]netlink.Route, error) {
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
