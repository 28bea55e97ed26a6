package kernel_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/infra"
	"github.com/enimasq/enimasq/cells/kernel"
)

// TestPrivilegedTablesFollowTheKernel: in a fresh network namespace, the
// tables hold its links, addresses, routes and rules, and follow changes
// made behind the cell's back (a veth with an address, a rule, a route of
// another table; the veth deleted takes its address and routes).
func TestPrivilegedTablesFollowTheKernel(t *testing.T) {
	ns := celltest.NewNetNS(t)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var (
		db     *statedb.DB
		tables kernel.ReadTables
	)
	hv := infra.New(infra.Core, kernel.Cell,
		cell.Provide(func() *netns.NsHandle { return &ns }),
		cell.Invoke(func(d *statedb.DB, l statedb.Table[*kernel.Link], a statedb.Table[*kernel.Addr],
			r statedb.Table[*kernel.Route], ru statedb.Table[*kernel.Rule]) {
			db, tables = d, kernel.ReadTables{Links: l, Addrs: a, Routes: r, Rules: ru}
		}))
	log := hivetest.Logger(t, hivetest.LogLevel(slog.LevelWarn))
	if err := hv.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hv.Stop(log, context.Background()) })

	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pod0"}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	pod0, err := h.LinkByName("pod0")
	if err == nil {
		err = h.LinkSetUp(pod0)
	}
	if err == nil {
		addr, _ := netlink.ParseAddr("192.0.2.1/24")
		err = h.AddrAdd(pod0, addr)
	}
	_, dst, _ := net.ParseCIDR("198.51.100.0/24")
	if err == nil {
		err = h.RouteAdd(&netlink.Route{LinkIndex: pod0.Attrs().Index, Dst: dst, Table: 11, Protocol: 237})
	}
	rule := netlink.NewRule()
	rule.Priority, rule.Table, rule.Protocol, rule.Family = 111, 11, 237, unix.AF_INET
	rule.Src = &net.IPNet{IP: net.ParseIP("192.0.2.1").To4(), Mask: net.CIDRMask(32, 32)}
	if err == nil {
		err = h.RuleAdd(rule)
	}
	if err != nil {
		t.Fatal(err)
	}

	const ruleID = "111 inet from 192.0.2.1/32 to all table 11 proto 237"
	celltest.Eventually(t, "pod0, its address, route and rule in the tables", func() (bool, string) {
		txn := db.ReadTxn()
		l, _, ok := tables.Links.Get(txn, kernel.LinkNameIndex.Query("pod0"))
		if !ok || l.Type != "veth" {
			return false, fmt.Sprintf("link pod0: %+v", l)
		}
		_, _, addr := tables.Addrs.Get(txn, kernel.AddrKeyIndex.Query(kernel.AddrKey{LinkIndex: l.Index, Prefix: netip.MustParsePrefix("192.0.2.1/24")}))
		route := false
		for r := range tables.Routes.List(txn, kernel.RouteTableIndex.Query(11)) {
			route = route || r.LinkIndex == l.Index && r.Dst.String() == "198.51.100.0/24" && r.Protocol == 237
		}
		_, _, rule := tables.Rules.Get(txn, kernel.RuleIDIndex.Query(ruleID))
		var rules []string
		for r := range tables.Rules.All(txn) {
			rules = append(rules, r.ID)
		}
		return addr && route && rule, fmt.Sprintf("address %t, route %t, rules %q", addr, route, rules)
	})

	// The link goes, its IPv4 route with it (no route notification).
	if err := h.LinkDel(pod0); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "pod0 and its route gone", func() (bool, string) {
		txn := db.ReadTxn()
		_, _, link := tables.Links.Get(txn, kernel.LinkNameIndex.Query("pod0"))
		routes := 0
		for range tables.Routes.List(txn, kernel.RouteTableIndex.Query(11)) {
			routes++
		}
		return !link && routes == 0, fmt.Sprintf("link %t, %d routes in table 11", link, routes)
	})
}
