package nodeips_test

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/infra"
	"github.com/enimasq/enimasq/cells/kernel"
	"github.com/enimasq/enimasq/cells/nodeips"
)

// TestPrivilegedWatcherFollowsTheInterfaces: the netlink rows of node-ips
// are the addresses of the namespace's interfaces, loopback excluded; the
// table is initialized after the first list, and an address added or
// removed later shows from the kernel's notification.
func TestPrivilegedWatcherFollowsTheInterfaces(t *testing.T) {
	celltest.RequireRoot(t)
	ns := celltest.NewNetNS(t)
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "node0"}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	addAddr := func(link, cidr string) {
		t.Helper()
		l, err := nl.LinkByName(link)
		if err == nil {
			err = nl.LinkSetUp(l)
		}
		if err == nil && cidr != "" {
			ip, ipnet, _ := net.ParseCIDR(cidr)
			ipnet.IP = ip
			err = nl.AddrAdd(l, &netlink.Addr{IPNet: ipnet})
		}
		if err != nil {
			t.Fatalf("%s %s: %s", link, cidr, err)
		}
	}
	addAddr("lo", "")
	addAddr("node0", "192.0.2.10/24")

	var (
		db    *statedb.DB
		table statedb.Table[*nodeips.NodeIP]
	)
	h := infra.New(infra.Core, kernel.Cell, nodeips.Cell,
		cell.Provide(func() *netns.NsHandle { return &ns }),
		cell.Invoke(func(d *statedb.DB, tbl statedb.Table[*nodeips.NodeIP]) { db, table = d, tbl }))
	log := hivetest.Logger(t, hivetest.LogLevel(slog.LevelWarn))
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(log, context.Background()) })

	waitRows := func(want ...string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			txn := db.ReadTxn()
			rows, watch := table.ListWatch(txn, nodeips.SourceIndex.Query(nodeips.SourceNetlink))
			var got []string
			for r := range rows {
				got = append(got, r.Addr.String()+" "+r.Device)
			}
			slices.Sort(got)
			initialized, _ := table.Initialized(txn)
			if initialized && slices.Equal(got, want) {
				return
			}
			select {
			case <-watch:
			case <-deadline:
				t.Fatalf("netlink rows %v (initialized %t), want %v", got, initialized, want)
			}
		}
	}
	waitRows("192.0.2.10 node0")

	addAddr("node0", "fd00::10/64")
	waitRows("192.0.2.10 node0", "fd00::10 node0")

	l, _ := nl.LinkByName("node0")
	if err := nl.AddrDel(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("192.0.2.10"), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	waitRows("fd00::10 node0")

	// Another source's rows are not the watcher's to prune.
	wtxn := db.WriteTxn(table.(statedb.RWTable[*nodeips.NodeIP]))
	nodeips.Sync(wtxn, table.(statedb.RWTable[*nodeips.NodeIP]), nodeips.SourceENI,
		[]*nodeips.NodeIP{{Addr: netip.MustParseAddr("10.130.100.10"), Source: nodeips.SourceENI, Device: "eni-1"}})
	wtxn.Commit()
	addAddr("node0", "198.51.100.7/24")
	waitRows("198.51.100.7 node0", "fd00::10 node0")
	if set := nodeips.Set(db.ReadTxn(), table); !set[netip.MustParseAddr("10.130.100.10")] || set[netip.MustParseAddr("127.0.0.1")] {
		t.Errorf("node's addresses %s: want the ENI's, never loopback", fmtSet(set))
	}
}

func fmtSet(set map[netip.Addr]bool) string {
	var out []string
	for a := range set {
		out = append(out, a.String())
	}
	slices.Sort(out)
	return "[" + strings.Join(out, ",") + "]"
}
