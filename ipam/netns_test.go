package ipam_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/ipam"
	"github.com/enimasq/enimasq/ipmasq"
)

// sampleLinks are links with the MACs of the sample CiliumNode's ENIs.
var sampleLinks = []struct{ name, mac string }{
	{"eni0", "0a:58:0a:82:00:0a"},
	{"eni1", "0a:58:0a:82:64:0a"},
	{"eni2", "0a:58:0a:82:70:0a"},
}

// testNetNS is a fresh network namespace and a netlink handle into it. No
// thread of the test process stays in it: the handle's sockets are bound to
// it when they are created.
type testNetNS struct {
	NS netns.NsHandle
	H  *netlink.Handle
}

// newTestNetNS creates a network namespace with lo up and the sample's ENI
// links (unless bare). It is gone at cleanup (the last reference, the
// handle, is closed).
func newTestNetNS(t testing.TB, bare bool) *testNetNS {
	t.Helper()
	celltest.RequireRoot(t)
	ns, err := func() (netns.NsHandle, error) {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			return netns.None(), err
		}
		defer orig.Close()
		ns, err := netns.New() // moves this thread into it
		if err != nil {
			runtime.UnlockOSThread()
			return netns.None(), err
		}
		if err := netns.Set(orig); err != nil {
			// The thread is stuck in the new namespace: let it die with
			// the goroutine (no UnlockOSThread).
			ns.Close()
			return netns.None(), fmt.Errorf("back to the original netns: %w", err)
		}
		runtime.UnlockOSThread()
		return ns, nil
	}()
	if err != nil {
		t.Fatalf("new netns: %s", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		t.Fatalf("netlink handle: %s", err)
	}
	n := &testNetNS{NS: ns, H: h}
	t.Cleanup(func() {
		h.Close()
		ns.Close()
	})
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

func (n *testNetNS) DelLink(name string) error {
	link, err := n.H.LinkByName(name)
	if err != nil {
		return err
	}
	return n.H.LinkDel(link)
}

// AllRules lists every rule of the namespace between priorities 1 and
// 32765 (the kernel's own are left out), any protocol, in kernel order:
// "111: from 10.130.100.133 to 10.0.0.0/8 lookup 11 proto 237".
func (n *testNetNS) AllRules() (string, error) {
	rules, err := n.H.RuleList(unix.AF_INET)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, r := range rules {
		if r.Priority == 0 || r.Priority >= 32766 {
			continue
		}
		from, to := "all", ""
		if r.Src != nil {
			from = hostOrNet(r.Src)
		}
		if r.Dst != nil {
			to = " to " + hostOrNet(r.Dst)
		}
		table := strconv.Itoa(r.Table)
		if r.Table == unix.RT_TABLE_MAIN {
			table = "main"
		}
		fmt.Fprintf(&b, "%d: from %s%s lookup %s proto %d\n", r.Priority, from, to, table, r.Protocol)
	}
	return b.String(), nil
}

func hostOrNet(n *net.IPNet) string {
	if ones, bits := n.Mask.Size(); ones == bits {
		return n.IP.String()
	}
	return n.String()
}

// rawRule parses "PRIO FROM TO TABLE PROTO" (FROM, TO: a CIDR or "all").
func rawRule(args []string) (*netlink.Rule, error) {
	if len(args) != 5 {
		return nil, errors.New("want: priority from to table protocol")
	}
	r := netlink.NewRule()
	var err error
	if r.Priority, err = strconv.Atoi(args[0]); err != nil {
		return nil, err
	}
	r.Family = unix.AF_INET
	for i, dst := range []**net.IPNet{&r.Src, &r.Dst} {
		if args[1+i] == "all" {
			continue
		}
		p, err := netip.ParsePrefix(args[1+i])
		if err != nil {
			return nil, err
		}
		*dst = &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
	}
	if r.Table, err = strconv.Atoi(args[3]); err != nil {
		return nil, err
	}
	proto, err := strconv.Atoi(args[4])
	if err != nil {
		return nil, err
	}
	r.Protocol = uint8(proto)
	return r, nil
}

// rawCommands change the namespace behind the agent's back, as aws-node,
// an operator or a detached ENI would.
func (n *testNetNS) rawCommands() cell.Cell {
	simple := func(summary, args string, nargs int, run func(args []string) error) script.Cmd {
		return script.Command(script.CmdUsage{Summary: summary, Args: args},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != nargs {
					return nil, script.ErrUsage
				}
				return nil, run(args)
			})
	}
	return cell.Provide(func() hive.ScriptCmdsOut {
		return hive.NewScriptCmds(map[string]script.Cmd{
			"raw/rule-add": simple("ip rule add, behind the agent's back", "prio from to table proto", 5, func(args []string) error {
				r, err := rawRule(args)
				if err != nil {
					return err
				}
				return n.H.RuleAdd(r)
			}),
			"raw/rule-del": simple("ip rule del, behind the agent's back", "prio from to table proto", 5, func(args []string) error {
				r, err := rawRule(args)
				if err != nil {
					return err
				}
				return n.H.RuleDel(r)
			}),
			"raw/link-add": simple("Add an up link with a MAC", "name mac", 2, func(args []string) error {
				return n.AddLink(args[0], args[1])
			}),
			"raw/link-del": simple("Delete a link", "name", 1, func(args []string) error {
				return n.DelLink(args[0])
			}),
			"raw/rules": script.Command(script.CmdUsage{Summary: "Every IPv4 rule (any protocol) but the kernel's own"},
				func(s *script.State, args ...string) (script.WaitFunc, error) {
					return func(*script.State) (string, string, error) {
						out, err := n.AllRules()
						return out, "", err
					}, nil
				}),
		})
	})
}

// countingNetlink counts the rule and route operations (once they return).
type countingNetlink struct {
	ipam.Netlink
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

// testCells are the cells under test: the ip-masq-agent, the IPAM working in
// the namespace through nl, and the raw commands.
func testCells(n *testNetNS, nl ipam.Netlink) []cell.Cell {
	return []cell.Cell{
		ipmasq.Cell,
		ipam.Cell,
		cell.Provide(func() *ipam.NetlinkTarget { return &ipam.NetlinkTarget{Handle: nl, NS: &n.NS} }),
		n.rawCommands(),
	}
}

func ipNetOf(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
