package datapath

import (
	"context"
	"iter"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"go4.org/netipx"

	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// With the CNI's ingress rules and a shared protocol (the Cilium build),
// pruning removes the owned-shape rules
// (priority 111, proto kernel, from one address into an ENI table) that no
// row desires, of the IPs with desired rules and of the IPs the CNI no
// longer routes to; it keeps those of an IP it routes to without desired
// rules (a pod between its CNI ADD and its endpoint), and every rule of
// another priority or protocol.
func TestPrivilegedPruneEmbeddingAgentRules(t *testing.T) {
	ns := celltest.NewNetNS(t)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	// Settings of the Cilium build: cilium-cni's ingress rules and routes,
	// Cilium's protocol.
	s := Settings{
		EgressMode: EgressModeCIDR, MasqueradeV4: true, EnableIPv4: true, SharedProtocol: true,
		PodRules: nodeconfig.PodRules{IngressPriority: 20, EgressPriority: 111, TableOffset: 10, Protocol: unix.RTPROT_KERNEL},
	}
	listed, routedNew, gone := netip.MustParseAddr("10.0.16.11"), netip.MustParseAddr("10.0.16.12"), netip.MustParseAddr("10.0.16.13")
	tenSlash8, stale := netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16")
	add := func(prio, proto, table int, from, to netip.Prefix) {
		t.Helper()
		r := netlink.NewRule()
		r.Priority, r.Family, r.Table, r.Protocol = prio, unix.AF_INET, table, uint8(proto)
		if from.IsValid() {
			r.Src = netipx.PrefixIPNet(from)
		}
		if to.IsValid() {
			r.Dst = netipx.PrefixIPNet(to)
		}
		if err := h.RuleAdd(r); err != nil {
			t.Fatalf("rule %d %s %s: %s", prio, from, to, err)
		}
	}
	host := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, 32) }
	kernel := unix.RTPROT_KERNEL
	add(111, kernel, 11, host(listed), tenSlash8) // desired
	add(111, kernel, 11, host(listed), stale)     // an older config's: pruned
	add(20, kernel, MainTable, netip.Prefix{}, host(routedNew))
	add(111, kernel, 11, host(routedNew), stale)          // not listed yet, routed: kept
	add(111, kernel, 11, host(gone), stale)               // not listed, not routed: pruned
	add(110, kernel, 11, host(listed), stale)             // another priority: kept
	add(111, unix.RTPROT_STATIC, 11, host(listed), stale) // another owner: kept

	// The listed IP's one desired rule.
	db := statedb.New()
	rules, err := NewRuleTable(db)
	if err != nil {
		t.Fatal(err)
	}
	desired := &Rule{RuleKey: RuleKey{Priority: 111, From: host(listed), To: tenSlash8, Table: 11}, Pod: listed, Owner: "shop/a"}
	wtxn := db.WriteTxn(rules)
	rules.Insert(wtxn, desired)
	wtxn.Commit()
	ops := &ruleOps{nl: &nlHandle{Netlink: h, families: []int{unix.AF_INET}}, settings: s, rules: rules}
	var objects iter.Seq2[*Rule, statedb.Revision] = func(yield func(*Rule, statedb.Revision) bool) { yield(desired, 1) }
	if err := ops.Prune(context.Background(), db.ReadTxn(), objects); err != nil {
		t.Fatal(err)
	}

	kernelRules, err := h.RuleList(unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range kernelRules {
		if r.Priority == 0 || r.Priority >= 32766 {
			continue
		}
		got = append(got, formatRule(RuleKey{Priority: r.Priority, From: fromIPNet(r.Src), To: fromIPNet(r.Dst), Table: r.Table})+" proto "+protoName(r.Protocol))
	}
	want := []string{
		"20:\tfrom all to 10.0.16.12 lookup main proto kernel",
		"110:\tfrom 10.0.16.11 to 192.168.0.0/16 lookup 11 proto kernel",
		"111:\tfrom 10.0.16.11 to 10.0.0.0/8 lookup 11 proto kernel",
		"111:\tfrom 10.0.16.12 to 192.168.0.0/16 lookup 11 proto kernel",
		"111:\tfrom 10.0.16.11 to 192.168.0.0/16 lookup 11 proto static",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("after the prune:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func protoName(p uint8) string {
	switch p {
	case unix.RTPROT_KERNEL:
		return "kernel"
	case unix.RTPROT_STATIC:
		return "static"
	}
	return "other"
}
