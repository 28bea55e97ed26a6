package ipam_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/kernel"
	"github.com/enimasq/enimasq/cells/nodeips"
	"github.com/enimasq/enimasq/ipam"
	"github.com/enimasq/enimasq/ipam/datapath"
	"github.com/enimasq/enimasq/ipam/netlinkfake"
	"github.com/enimasq/enimasq/ipmasq"
)

// testNetwork is where a test's agent programs its rules and routes: a
// fresh network namespace (testNetNS, root only) or a netlinkfake.Netlink
// (fakeNetwork). The same scripts and raw commands run on both.
type testNetwork interface {
	// Handle acts on the network directly, behind the agent's back.
	Handle() datapath.Netlink
	// Target makes the agent program the network through nl (Handle, or
	// a wrapper of it) and repair from the kernel tables of it.
	Target(nl datapath.Netlink) *datapath.NetlinkTarget
	// KernelCell makes cells/kernel follow the network.
	KernelCell() cell.Cell
	AddLink(name, mac string) error
	DelLink(name string) error
}

// fakeNetwork is a netlinkfake.Netlink as a testNetwork.
type fakeNetwork struct {
	*netlinkfake.Netlink
}

// newFakeNetwork is a netlinkfake.Netlink with the sample's ENI links (unless
// bare), as newTestNetNS's namespace.
func newFakeNetwork(t testing.TB, bare bool) fakeNetwork {
	t.Helper()
	n := fakeNetwork{netlinkfake.New()}
	if !bare {
		for _, l := range sampleLinks {
			if err := n.AddLink(l.name, l.mac); err != nil {
				t.Fatal(err)
			}
		}
	}
	return n
}

func (n fakeNetwork) Handle() datapath.Netlink { return n.Netlink }

func (n fakeNetwork) Target(nl datapath.Netlink) *datapath.NetlinkTarget {
	return &datapath.NetlinkTarget{Handle: nl, Repair: true}
}

func (n fakeNetwork) KernelCell() cell.Cell {
	return cell.Provide(func() kernel.Source { return n.Netlink })
}

func (n fakeNetwork) AddLink(name, mac string) error {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return err
	}
	return n.Netlink.AddLink(name, hw)
}

// allRules lists every IPv4 rule between priorities 1 and 32765 (the
// kernel's own are left out), any protocol, in list order:
// "111: from 10.130.100.133 to 10.0.0.0/8 lookup 11 proto 237".
func allRules(nl datapath.Netlink) (string, error) {
	rules, err := nl.RuleList(unix.AF_INET)
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
		*dst = ipNetOf(p)
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

// rawRoute parses "TABLE DST GW DEV PROTO" (DST: a CIDR or "default") into
// an onlink route via GW on the link DEV.
func rawRoute(h datapath.Netlink, args []string) (*netlink.Route, error) {
	table, err := strconv.Atoi(args[0])
	if err != nil {
		return nil, err
	}
	dst := netip.MustParsePrefix("0.0.0.0/0")
	if args[1] != "default" {
		if dst, err = netip.ParsePrefix(args[1]); err != nil {
			return nil, err
		}
	}
	gw, err := netip.ParseAddr(args[2])
	if err != nil {
		return nil, err
	}
	links, err := h.LinkList()
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(links, func(l netlink.Link) bool { return l.Attrs().Name == args[3] })
	if i < 0 {
		return nil, fmt.Errorf("no link %s", args[3])
	}
	proto, err := strconv.Atoi(args[4])
	if err != nil {
		return nil, err
	}
	return &netlink.Route{Family: unix.AF_INET, Table: table, Dst: ipNetOf(dst), Gw: gw.AsSlice(),
		LinkIndex: links[i].Attrs().Index, Protocol: netlink.RouteProtocol(proto), Flags: int(netlink.FLAG_ONLINK)}, nil
}

// rawCommands change the network behind the agent's back, as aws-node, an
// operator or a detached ENI would: on a netlinkfake.Netlink as on the kernel, the
// agent hears of it only through the network's notifications.
func rawCommands(n testNetwork) cell.Cell {
	simple := func(summary, args string, nargs int, run func(args []string) error) script.Cmd {
		return script.Command(script.CmdUsage{Summary: summary, Args: args},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != nargs {
					return nil, script.ErrUsage
				}
				return nil, run(args)
			})
	}
	rule := func(op func(*netlink.Rule) error) func(args []string) error {
		return func(args []string) error {
			r, err := rawRule(args)
			if err != nil {
				return err
			}
			return op(r)
		}
	}
	return cell.Provide(func() hive.ScriptCmdsOut {
		return hive.NewScriptCmds(map[string]script.Cmd{
			"raw/rule-add": simple("ip rule add, behind the agent's back", "prio from to table proto", 5, rule(n.Handle().RuleAdd)),
			"raw/rule-del": simple("ip rule del, behind the agent's back", "prio from to table proto", 5, rule(n.Handle().RuleDel)),
			"raw/route-replace": simple("ip route replace TABLE DST via GW dev DEV proto PROTO onlink, behind the agent's back",
				"table dst gw dev proto", 5, func(args []string) error {
					r, err := rawRoute(n.Handle(), args)
					if err != nil {
						return err
					}
					return n.Handle().RouteReplace(r)
				}),
			"raw/link-add": simple("Add an up link with a MAC", "name mac", 2, func(args []string) error {
				return n.AddLink(args[0], args[1])
			}),
			"raw/link-del": simple("Delete a link (and its routes)", "name", 1, func(args []string) error {
				return n.DelLink(args[0])
			}),
			"raw/rules": script.Command(script.CmdUsage{Summary: "Every IPv4 rule (any protocol) but the kernel's own"},
				func(s *script.State, args ...string) (script.WaitFunc, error) {
					return func(*script.State) (string, string, error) {
						out, err := allRules(n.Handle())
						return out, "", err
					}, nil
				}),
		})
	})
}

// testCells are the cells under test: the ip-masq-agent, the IPAM working in
// the network through nl, and the raw commands.
func testCells(n testNetwork, nl datapath.Netlink) []cell.Cell {
	return []cell.Cell{
		ipmasq.Cell,
		ipam.Cell,
		// node-ips without its netlink watcher: the rows are ipam's.
		cell.Provide(nodeips.NewTable, statedb.RWTable[*nodeips.NodeIP].ToTable),
		cell.Provide(func() *datapath.NetlinkTarget { return n.Target(nl) }),
		kernel.Cell,
		n.KernelCell(),
		rawCommands(n),
	}
}
