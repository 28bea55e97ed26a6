package kernel

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/nldump"
	"github.com/enimasq/enimasq/cells/tablesync"
)

// kindSet is a set of the tables: which ones a change made stale.
type kindSet uint8

const (
	kindLinks kindSet = 1 << iota
	kindAddrs
	kindRoutes
	kindRules

	allKinds = kindLinks | kindAddrs | kindRoutes | kindRules
)

func (k kindSet) String() string {
	var names []string
	for _, n := range []struct {
		k    kindSet
		name string
	}{{kindLinks, "links"}, {kindAddrs, "addresses"}, {kindRoutes, "routes"}, {kindRules, "rules"}} {
		if k&n.k != 0 {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// families are the families the cell follows: both, whatever the agent's.
var families = []int{unix.AF_INET, unix.AF_INET6}

// snapshot is what one resync listed of the stale kinds.
type snapshot struct {
	kinds  kindSet
	links  []*Link
	addrs  []*Addr
	routes []*Route
	rules  []*Rule
}

// dump lists the kinds of k from src, each with nldump (a dump that a
// change interrupts is run again, never taken half).
func dump(src Source, k kindSet) (*snapshot, error) {
	s := &snapshot{kinds: k}
	if k&kindLinks != 0 {
		links, err := nldump.List("ip link list", src.LinkList)
		if err != nil {
			return nil, err
		}
		for _, l := range links {
			s.links = append(s.links, linkOf(l))
		}
	}
	if k&kindAddrs != 0 {
		addrs, err := nldump.List("ip addr list", func() ([]netlink.Addr, error) { return src.AddrList(nil, netlink.FAMILY_ALL) })
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			if row, ok := addrOf(a); ok {
				s.addrs = append(s.addrs, row)
			}
		}
	}
	for _, fam := range families {
		if k&kindRoutes != 0 {
			routes, err := nldump.List("ip route list table all", func() ([]netlink.Route, error) {
				return src.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
			})
			if err != nil {
				return nil, fmt.Errorf("family %d: %w", fam, err)
			}
			for _, r := range routes {
				s.routes = append(s.routes, routeOf(r))
			}
		}
		if k&kindRules != 0 {
			rules, err := nldump.List("ip rule list", func() ([]netlink.Rule, error) { return src.RuleList(fam) })
			if err != nil {
				return nil, fmt.Errorf("family %d: %w", fam, err)
			}
			for _, r := range rules {
				s.rules = append(s.rules, ruleOf(r))
			}
		}
	}
	return s, nil
}

var (
	linkRows = tablesync.Rows[*Link, int]{
		Key:   func(l *Link) int { return l.Index },
		Query: LinkIndex.Query,
		Same:  func(old, want *Link) bool { return *old == *want },
	}
	addrRows = tablesync.Rows[*Addr, AddrKey]{
		Key:   (*Addr).Key,
		Query: AddrKeyIndex.Query,
		Same:  func(old, want *Addr) bool { return *old == *want },
	}
	// A route of the same ID may differ in what the ID leaves out (a
	// preferred source, a metric): compared whole.
	routeRows = tablesync.Rows[*Route, string]{
		Key:   func(r *Route) string { return r.ID },
		Query: RouteIDIndex.Query,
		Same:  func(old, want *Route) bool { return reflect.DeepEqual(old.Route, want.Route) },
	}
	ruleRows = tablesync.Rows[*Rule, string]{
		Key:   func(r *Rule) string { return r.ID },
		Query: RuleIDIndex.Query,
		Same:  func(old, want *Rule) bool { return reflect.DeepEqual(old.Rule, want.Rule) },
	}
)

// write makes the tables of the snapshot's kinds equal to it, within wtxn,
// and returns the rows changed.
func (s *snapshot) write(wtxn statedb.WriteTxn, t *Tables) int {
	n := 0
	if s.kinds&kindLinks != 0 {
		n += linkRows.Sync(wtxn, t.Links, s.links)
	}
	if s.kinds&kindAddrs != 0 {
		n += addrRows.Sync(wtxn, t.Addrs, s.addrs)
	}
	if s.kinds&kindRoutes != 0 {
		n += routeRows.Sync(wtxn, t.Routes, s.routes)
	}
	if s.kinds&kindRules != 0 {
		n += ruleRows.Sync(wtxn, t.Rules, s.rules)
	}
	return n
}
