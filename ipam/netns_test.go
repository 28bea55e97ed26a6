package ipam_test

import (
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/ipam/datapath"
)

// sampleLinks are links with the MACs of the sample CiliumNode's ENIs.
var sampleLinks = []struct{ name, mac string }{
	{"eni0", "0a:58:0a:82:00:0a"},
	{"eni1", "0a:58:0a:82:64:0a"},
	{"eni2", "0a:58:0a:82:70:0a"},
}

// testNetNS is a fresh network namespace and a netlink handle into it: the
// testNetwork of privileged tests. No thread of the test process stays in
// it: the handle's sockets are bound to it when they are created.
type testNetNS struct {
	NS netns.NsHandle
	H  *netlink.Handle
}

// newTestNetNS creates a network namespace with lo up and the sample's ENI
// links (unless bare). It is gone at cleanup (the last reference, the
// handle, is closed).
func newTestNetNS(t testing.TB, bare bool) *testNetNS {
	t.Helper()
	ns := celltest.NewNetNS(t)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink handle: %s", err)
	}
	n := &testNetNS{NS: ns, H: h}
	t.Cleanup(func() { h.Close() })
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("lo up: %s", err)
	}
	if !bare {
		for _, l := range sampleLinks {
			if err := n.AddLink(l.name, l.mac); err != nil {
				t.Fatal(err)
			}
		}
	}
	return n
}

// AddLink adds an up link with the MAC: a dummy where the kernel has them,
// else an ifb (the test kernels here have no dummy driver).
func (n *testNetNS) AddLink(name, mac string) error {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return err
	}
	attrs := netlink.LinkAttrs{Name: name, HardwareAddr: hw}
	if err := n.H.LinkAdd(&netlink.Dummy{LinkAttrs: attrs}); err != nil {
		if err := n.H.LinkAdd(&netlink.Ifb{LinkAttrs: attrs}); err != nil {
			return fmt.Errorf("add link %s: %w", name, err)
		}
	}
	link, err := n.H.LinkByName(name)
	if err != nil {
		return err
	}
	return n.H.LinkSetUp(link)
}

func (n *testNetNS) Handle() datapath.Netlink { return n.H }

// Target programs the namespace through nl and repairs from the kernel
// tables of it (KernelCell).
func (n *testNetNS) Target(nl datapath.Netlink) *datapath.NetlinkTarget {
	return &datapath.NetlinkTarget{Handle: nl, Repair: true}
}

// KernelCell makes cells/kernel follow the namespace.
func (n *testNetNS) KernelCell() cell.Cell {
	return cell.Provide(func() *netns.NsHandle { return &n.NS })
}

func (n *testNetNS) DelLink(name string) error {
	link, err := n.H.LinkByName(name)
	if err != nil {
		return err
	}
	return n.H.LinkDel(link)
}

// countingNetlink counts the rule and route operations (once they return).
type countingNetlink struct {
	datapath.Netlink
	ruleAdds, ruleDels, routeReplaces, routeDels atomic.Int64
}

func (c *countingNetlink) RuleAdd(r *netlink.Rule) error {
	defer c.ruleAdds.Add(1)
	return c.Netlink.RuleAdd(r)
}

func (c *countingNetlink) RuleDel(r *netlink.Rule) error {
	defer c.ruleDels.Add(1)
	return c.Netlink.RuleDel(r)
}

func (c *countingNetlink) RouteReplace(r *netlink.Route) error {
	defer c.routeReplaces.Add(1)
	return c.Netlink.RouteReplace(r)
}

func (c *countingNetlink) RouteDel(r *netlink.Route) error {
	defer c.routeDels.Add(1)
	return c.Netlink.RouteDel(r)
}

func ipNetOf(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
