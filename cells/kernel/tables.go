package kernel

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"
)

// The tables of the kernel's state; this cell alone writes them.
const (
	LinksTableName  = "kernel-links"
	AddrsTableName  = "kernel-addrs"
	RoutesTableName = "kernel-routes"
	RulesTableName  = "kernel-rules"
)

// Link is a network interface.
type Link struct {
	Index int
	Name  string
	// Type is netlink's link type: "veth", "device", "dummy", ...
	Type string
	// MAC is the hardware address as net.HardwareAddr prints it ("" for
	// none).
	MAC string
}

func (l *Link) TableHeader() []string { return []string{"Index", "Name", "Type", "MAC"} }
func (l *Link) TableRow() []string {
	return []string{strconv.Itoa(l.Index), l.Name, l.Type, l.MAC}
}

func linkOf(l netlink.Link) *Link {
	a := l.Attrs()
	return &Link{Index: a.Index, Name: a.Name, Type: l.Type(), MAC: a.HardwareAddr.String()}
}

// Addr is an address of an interface.
type Addr struct {
	LinkIndex int
	// Prefix is the address (unmapped) with its prefix length.
	Prefix netip.Prefix
	// Label is the address's label (IPv4), usually the link's name.
	Label string
	Scope int
}

// AddrKey is the primary key of an address.
type AddrKey struct {
	LinkIndex int
	Prefix    netip.Prefix
}

func (a *Addr) Key() AddrKey { return AddrKey{a.LinkIndex, a.Prefix} }

func (a *Addr) TableHeader() []string { return []string{"Link", "Address", "Label", "Scope"} }
func (a *Addr) TableRow() []string {
	return []string{strconv.Itoa(a.LinkIndex), a.Prefix.String(), a.Label, strconv.Itoa(a.Scope)}
}

// addrOf is the row of a kernel address; false for one without an IP.
func addrOf(a netlink.Addr) (*Addr, bool) {
	if a.IPNet == nil {
		return nil, false
	}
	ip, ok := netip.AddrFromSlice(a.IP)
	if !ok {
		return nil, false
	}
	ones, _ := a.Mask.Size()
	return &Addr{LinkIndex: a.LinkIndex, Prefix: netip.PrefixFrom(ip.Unmap(), ones), Label: a.Label, Scope: a.Scope}, true
}

// Route is a route of any table, as netlink lists it. Its netlink.Route is
// read only.
type Route struct {
	netlink.Route
	// ID tells it from every other route (key and attributes).
	ID string
}

func (r *Route) TableHeader() []string {
	return []string{"Table", "Destination", "Gateway", "Link", "Protocol", "Scope", "Priority"}
}
func (r *Route) TableRow() []string {
	return []string{strconv.Itoa(r.Table), ipNetString(r.Dst), r.Gw.String(), strconv.Itoa(r.LinkIndex),
		r.Protocol.String(), r.Scope.String(), strconv.Itoa(r.Priority)}
}

// routeOf is the row of a kernel route.
func routeOf(r netlink.Route) *Route {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %d %s %d %d %d %d %s %d %d", r.Family, r.Table, ipNetString(r.Dst), r.Tos, r.Priority,
		r.Type, r.LinkIndex, r.Gw, r.Protocol, r.Scope)
	for _, nh := range r.MultiPath {
		fmt.Fprintf(&b, " nexthop %d %s", nh.LinkIndex, nh.Gw)
	}
	return &Route{Route: r, ID: b.String()}
}

// Rule is an ip rule, as netlink lists it. Its netlink.Rule is read only.
type Rule struct {
	netlink.Rule
	// ID tells it from every other rule (every selector and action).
	ID string
}

func (r *Rule) TableHeader() []string { return []string{"Rule"} }
func (r *Rule) TableRow() []string    { return []string{r.ID} }

// ruleOf is the row of a kernel rule.
func ruleOf(r netlink.Rule) *Rule {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s from %s to %s table %d proto %d", r.Priority, familyName(r.Family),
		ipNetString(r.Src), ipNetString(r.Dst), r.Table, r.Protocol)
	opt := func(name string, v any, set bool) {
		if set {
			fmt.Fprintf(&b, " %s %v", name, v)
		}
	}
	opt("type", r.Type, r.Type != 0)
	opt("fwmark", r.Mark, r.Mark != 0)
	if r.Mask != nil {
		opt("mask", *r.Mask, true)
	}
	opt("tos", r.Tos, r.Tos != 0)
	opt("tun_id", r.TunID, r.TunID != 0)
	opt("goto", r.Goto, r.Goto >= 0)
	opt("flow", r.Flow, r.Flow > 0)
	opt("iif", r.IifName, r.IifName != "")
	opt("oif", r.OifName, r.OifName != "")
	opt("not", "", r.Invert)
	if r.Dport != nil {
		opt("dport", *r.Dport, true)
	}
	if r.Sport != nil {
		opt("sport", *r.Sport, true)
	}
	opt("ipproto", r.IPProto, r.IPProto != 0)
	if r.UIDRange != nil {
		opt("uidrange", *r.UIDRange, true)
	}
	opt("suppress_prefixlength", r.SuppressPrefixlen, r.SuppressPrefixlen > 0)
	opt("suppress_ifgroup", r.SuppressIfgroup, r.SuppressIfgroup > 0)
	return &Rule{Rule: r, ID: b.String()}
}

func familyName(f int) string {
	switch f {
	case unix.AF_INET:
		return "inet"
	case unix.AF_INET6:
		return "inet6"
	}
	return "family " + strconv.Itoa(f)
}

func ipNetString(n *net.IPNet) string {
	if n == nil {
		return "all"
	}
	p, ok := netipx.FromStdIPNet(n)
	if !ok {
		return n.String()
	}
	return p.String()
}

var (
	// LinkIndex is the primary index of kernel-links: the ifindex.
	LinkIndex = statedb.Index[*Link, int]{
		Name:       "index",
		FromObject: func(l *Link) index.KeySet { return index.NewKeySet(index.Int(l.Index)) },
		FromKey:    index.Int,
		FromString: index.IntString,
		Unique:     true,
	}
	// LinkNameIndex finds a link by name (not unique: a resync that
	// swaps two names writes one row before the other).
	LinkNameIndex = statedb.Index[*Link, string]{
		Name:       "name",
		FromObject: func(l *Link) index.KeySet { return index.NewKeySet(index.String(l.Name)) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     false,
	}
	// AddrKeyIndex is the primary index of kernel-addrs: link and prefix.
	AddrKeyIndex = statedb.Index[*Addr, AddrKey]{
		Name:       "key",
		FromObject: func(a *Addr) index.KeySet { return index.NewKeySet(addrKey(a.Key())) },
		FromKey:    addrKey,
		FromString: func(s string) (index.Key, error) {
			// "link prefix"
			l, p, _ := strings.Cut(s, " ")
			i, err := strconv.Atoi(l)
			if err != nil {
				return nil, err
			}
			prefix, err := netip.ParsePrefix(p)
			if err != nil {
				return nil, err
			}
			return addrKey(AddrKey{i, prefix}), nil
		},
		Unique: true,
	}
	// RouteIDIndex is the primary index of kernel-routes.
	RouteIDIndex = statedb.Index[*Route, string]{
		Name:       "id",
		FromObject: func(r *Route) index.KeySet { return index.NewKeySet(index.String(r.ID)) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// RouteTableIndex lists the routes of one routing table.
	RouteTableIndex = statedb.Index[*Route, int]{
		Name:       "table",
		FromObject: func(r *Route) index.KeySet { return index.NewKeySet(index.Int(r.Table)) },
		FromKey:    index.Int,
		FromString: index.IntString,
		Unique:     false,
	}
	// RuleIDIndex is the primary index of kernel-rules.
	RuleIDIndex = statedb.Index[*Rule, string]{
		Name:       "id",
		FromObject: func(r *Rule) index.KeySet { return index.NewKeySet(index.String(r.ID)) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
)

func addrKey(k AddrKey) index.Key {
	return append(index.Int(k.LinkIndex), []byte(k.Prefix.String())...)
}

// Tables are the kernel's state, as the cell keeps it.
type Tables struct {
	Links  statedb.RWTable[*Link]
	Addrs  statedb.RWTable[*Addr]
	Routes statedb.RWTable[*Route]
	Rules  statedb.RWTable[*Rule]
}

// NewTables creates and registers the tables.
func NewTables(db *statedb.DB) (*Tables, error) {
	var (
		t   Tables
		err error
	)
	if t.Links, err = statedb.NewTable(db, LinksTableName, LinkIndex, LinkNameIndex); err != nil {
		return nil, err
	}
	if t.Addrs, err = statedb.NewTable(db, AddrsTableName, AddrKeyIndex); err != nil {
		return nil, err
	}
	if t.Routes, err = statedb.NewTable(db, RoutesTableName, RouteIDIndex, RouteTableIndex); err != nil {
		return nil, err
	}
	if t.Rules, err = statedb.NewTable(db, RulesTableName, RuleIDIndex); err != nil {
		return nil, err
	}
	return &t, nil
}
