package ipam_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/kernel"
	"github.com/enimasq/enimasq/ipam/datapath"
)

// netlinkStep is one operation and what the kernel answers: the errno (0:
// success) and the rule and route notifications it sends.
type netlinkStep struct {
	name  string
	op    func(n testNetwork) error
	errno unix.Errno
	emits []kernel.Change
}

func testRule(prio int, from, to string, table int, proto uint8) *netlink.Rule {
	r := netlink.NewRule()
	r.Priority, r.Family, r.Table, r.Protocol = prio, unix.AF_INET, table, proto
	if from != "" {
		r.Src = ipNetOf(netip.MustParsePrefix(from))
	}
	if to != "" {
		r.Dst = ipNetOf(netip.MustParsePrefix(to))
	}
	return r
}

func linkIndex(n testNetwork, name string) int {
	links, _ := n.Handle().LinkList()
	for _, l := range links {
		if l.Attrs().Name == name {
			return l.Attrs().Index
		}
	}
	return -1
}

// testRoute is a route of enimasq's protocol in table through link (gw ""
// for a link-scope route).
func testRoute(n testNetwork, table int, dst, gw, link string) *netlink.Route {
	p := netip.MustParsePrefix(dst)
	r := &netlink.Route{Table: table, Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)},
		LinkIndex: linkIndex(n, link), Protocol: datapath.RTProto, Scope: netlink.SCOPE_LINK}
	if gw != "" {
		r.Gw, r.Scope = net.ParseIP(gw), netlink.SCOPE_UNIVERSE
	}
	return r
}

func ruleStep(name string, op func(nl datapath.Netlink) func(*netlink.Rule) error, r *netlink.Rule, errno unix.Errno, emits ...kernel.Change) netlinkStep {
	return netlinkStep{name: name, op: func(n testNetwork) error { return op(n.Handle())(r) }, errno: errno, emits: emits}
}

func replaceStep(name string, table int, dst, gw, link string, errno unix.Errno, emits ...kernel.Change) netlinkStep {
	return netlinkStep{name: name, op: func(n testNetwork) error {
		return n.Handle().RouteReplace(testRoute(n, table, dst, gw, link))
	}, errno: errno, emits: emits}
}

func add(nl datapath.Netlink) func(*netlink.Rule) error { return nl.RuleAdd }
func del(nl datapath.Netlink) func(*netlink.Rule) error { return nl.RuleDel }

const (
	podA = "10.130.100.133/32"
	podB = "10.130.100.134/32"
)

// netlinkSteps are the kernel behaviours the reconcilers rely on (ops.go:
// ruleOps.Update's EEXIST, pruneLoose's deletes, routeOps), in one
// sequence whose end state is compared too.
var netlinkSteps = []netlinkStep{
	ruleStep("add", add, testRule(111, podA, "10.0.0.0/8", 11, 237), 0, kernel.RuleAdded),
	ruleStep("same selectors, another protocol", add, testRule(111, podA, "10.0.0.0/8", 11, 3), 0, kernel.RuleAdded),
	ruleStep("no destination: matches a rule with one", add, testRule(111, podA, "", 11, 237), unix.EEXIST),
	ruleStep("another destination", add, testRule(111, podA, "172.16.0.0/12", 11, 237), 0, kernel.RuleAdded),
	ruleStep("duplicate", add, testRule(111, podA, "10.0.0.0/8", 11, 237), unix.EEXIST),
	ruleStep("another table", add, testRule(111, podA, "10.0.0.0/8", 12, 237), 0, kernel.RuleAdded),
	ruleStep("delete without destination takes the first", del, testRule(111, podA, "", 11, 237), 0, kernel.RuleDeleted),
	ruleStep("delete a missing rule", del, testRule(111, podB, "", 11, 237), unix.ENOENT),
	ruleStep("delete by source only", del, testRule(-1, podA, "", 0, 0), 0, kernel.RuleDeleted),
	ruleStep("no priority: the kernel's default", add, testRule(-1, podB, "", 12, 237), 0, kernel.RuleAdded),
	replaceStep("gateway not reachable", 11, "0.0.0.0/0", "10.130.96.1", "eni1", unix.ENETUNREACH),
	replaceStep("link route", 11, "10.130.96.1/32", "", "eni1", 0, kernel.RouteAdded),
	replaceStep("gateway route", 11, "0.0.0.0/0", "10.130.96.1", "eni1", 0, kernel.RouteAdded),
	replaceStep("replace on another link", 11, "10.130.96.1/32", "", "eni2", 0, kernel.RouteAdded),
	replaceStep("table 12 link route", 12, "10.130.112.1/32", "", "eni2", 0, kernel.RouteAdded),
	replaceStep("host bits", 11, "10.130.96.1/20", "", "eni1", unix.EINVAL),
	{name: "delete in the wrong scope", op: func(n testNetwork) error {
		r := testRoute(n, 11, "10.130.96.1/32", "", "eni2")
		r.Scope, r.LinkIndex = netlink.SCOPE_UNIVERSE, 0
		return n.Handle().RouteDel(r)
	}, errno: unix.ESRCH},
	{name: "delete with another protocol", op: func(n testNetwork) error {
		return n.Handle().RouteDel(&netlink.Route{Table: 12, Dst: ipNetOf(netip.MustParsePrefix("10.130.112.1/32")),
			Protocol: unix.RTPROT_STATIC, Scope: netlink.SCOPE_NOWHERE})
	}, errno: unix.ESRCH},
	{name: "delete in any scope", op: func(n testNetwork) error {
		return n.Handle().RouteDel(&netlink.Route{Table: 12, Dst: ipNetOf(netip.MustParsePrefix("10.130.112.1/32")),
			Protocol: datapath.RTProto, Scope: netlink.SCOPE_NOWHERE})
	}, emits: []kernel.Change{kernel.RouteDeleted}},
	// The link's IPv4 routes go without a notification of their own.
	{name: "delete eni2", op: func(n testNetwork) error { return n.DelLink("eni2") }},
	ruleStep("marker", add, testRule(999, podB, "", 99, 237), 0, kernel.RuleAdded),
}

// netlinkEndState is the rules and routes after netlinkSteps.
const netlinkEndState = `110: from 10.130.100.134 lookup 12 proto 237
111: from 10.130.100.133 to 172.16.0.0/12 lookup 11 proto 237
111: from 10.130.100.133 to 10.0.0.0/8 lookup 12 proto 237
999: from 10.130.100.134 lookup 99 proto 237
table 11: default via 10.130.96.1 dev eni1
`

func runNetlinkSteps(t *testing.T, n testNetwork, changes kernel.Source) {
	sub, err := changes.Subscribe(kernel.Groups{Families: []int{unix.AF_INET}, Routes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var want []kernel.Change
	for _, s := range netlinkSteps {
		err := s.op(n)
		if got := errnoOf(err); got != s.errno {
			t.Errorf("%s: error %v, want errno %d (%s)", s.name, err, s.errno, s.errno)
		}
		want = append(want, s.emits...)
	}
	rules, err := allRules(n.Handle())
	if err != nil {
		t.Fatal(err)
	}
	routes, err := datapath.KernelRoutes(n.Handle(), []int{unix.AF_INET})
	if err != nil {
		t.Fatal(err)
	}
	if got := rules + routes; got != netlinkEndState {
		t.Errorf("end state:\n%s\nwant:\n%s", got, netlinkEndState)
	}

	// The kernel queues a notification before it acknowledges the
	// operation: they are all there, the deadline is a safety net.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []kernel.Change
	for len(got) < len(want) {
		changes, err := sub.Receive(ctx)
		if err != nil {
			t.Fatalf("notifications so far %v, want %v: %s", got, want, err)
		}
		// Link notifications differ by link type (a veth sends more).
		got = append(got, slices.DeleteFunc(changes, func(c kernel.Change) bool {
			return c == kernel.LinkChanged || c == kernel.LinkDeleted
		})...)
	}
	if !slices.Equal(got, want) {
		t.Errorf("notifications %v, want %v", got, want)
	}
}

func errnoOf(err error) unix.Errno {
	var errno unix.Errno
	if err != nil && !errors.As(err, &errno) {
		return unix.Errno(^uintptr(0))
	}
	return errno
}

// The fake answers as the kernel does (TestPrivilegedFakeNetlinkMatchesKernel
// runs the same steps on the kernel).
func TestFakeNetlinkSemantics(t *testing.T) {
	n := newFakeNetwork(t, false)
	runNetlinkSteps(t, n, n.Netlink)
}

func TestPrivilegedFakeNetlinkMatchesKernel(t *testing.T) {
	n := newTestNetNS(t, false)
	src, err := kernel.NewNetlink(&n.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	runNetlinkSteps(t, n, src)
}

// Deleting a link deletes its routes, and the subscription hears of it.
func TestFakeNetlinkLinkDeleteTakesRoutes(t *testing.T) {
	n := newFakeNetwork(t, false)
	sub, err := n.Subscribe(kernel.Groups{Families: []int{unix.AF_INET}, Routes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := n.Handle().RouteReplace(testRoute(n, 11, "10.130.96.1/32", "", "eni1")); err != nil {
		t.Fatal(err)
	}
	if err := n.DelLink("eni1"); err != nil {
		t.Fatal(err)
	}
	routes, err := datapath.ListRoutes(n.Handle(), []int{unix.AF_INET})
	if err != nil || len(routes) != 0 {
		t.Errorf("routes after the link went: %v %v", routes, err)
	}
	got, err := sub.Receive(context.Background())
	if want := []kernel.Change{kernel.RouteAdded, kernel.LinkDeleted}; err != nil || !slices.Equal(got, want) {
		t.Errorf("notifications %v %v, want %v", got, err, want)
	}
	if err := n.DelLink("eni1"); errnoOf(err) != unix.ENODEV {
		t.Errorf("deleting a missing link: %v", err)
	}
}
