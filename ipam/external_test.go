package ipam

import (
	"context"
	"iter"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

var externalENIs = []*ENI{
	{ID: "eni-0", Number: 0, PrimaryIP: netip.MustParseAddr("10.0.0.10"), Skipped: "number 0 < first-interface-index 1"},
	{ID: "eni-1", Number: 1, PrimaryIP: netip.MustParseAddr("10.0.16.10"),
		Addresses: []netip.Addr{netip.MustParseAddr("10.0.16.11"), netip.MustParseAddr("10.0.16.12")},
		Prefixes:  []netip.Prefix{netip.MustParsePrefix("10.0.32.16/28")}},
}

// An IP of the embedding agent goes on the usable ENI that holds it, by its
// addresses, delegated prefixes or primary IP, as Cilium's ENI IPAM places
// it; an IP no usable ENI holds is Orphaned, with why.
func TestPlaceExternal(t *testing.T) {
	for _, tc := range []struct {
		ip, eni string
		reason  string // "" when placed
	}{
		{"10.0.16.11", "eni-1", ""},
		{"10.0.32.20", "eni-1", ""},
		{"10.0.16.10", "eni-1", ""},
		{"10.0.0.10", "", "on eni-0, which is skipped"},
		{"10.9.9.9", "", "no ENI of the CiliumNode holds 10.9.9.9"},
	} {
		a := placeExternal(ExternalIP{IP: netip.MustParseAddr(tc.ip), Owner: "shop/a"}, externalENIs)
		switch {
		case tc.reason == "" && (a.State != StateAllocated || a.ENI != tc.eni):
			t.Errorf("%s: %+v, want Allocated on %s", tc.ip, a, tc.eni)
		case tc.reason != "" && (a.State != StateOrphaned || a.ENI != "" || !strings.Contains(a.Reason, tc.reason)):
			t.Errorf("%s: %+v, want Orphaned: ...%s...", tc.ip, a, tc.reason)
		}
	}
}

// Sync keeps ipam-allocations equal to the set it is given and initializes
// the table only once the set is complete and the ENIs are read: the rule
// reconciler never prunes on a partial set.
func TestExternalAllocationsSync(t *testing.T) {
	db := statedb.New()
	allocs, err := NewAllocationTable(db)
	if err != nil {
		t.Fatal(err)
	}
	enis, err := NewENITable(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(allocs, enis)
	allocsInit := allocs.RegisterInitializer(wtxn, "embedding-agent-pod-set")
	enisInit := enis.RegisterInitializer(wtxn, "ciliumnode")
	for _, e := range externalENIs {
		enis.Insert(wtxn, e)
	}
	wtxn.Commit()
	x := &ExternalAllocations{db: db, allocs: allocs, enis: enis, initDone: allocsInit}
	ip := func(s string) ExternalIP { return ExternalIP{IP: netip.MustParseAddr(s), Owner: "shop/" + s} }
	rows := func() []string {
		var out []string
		for a := range allocs.All(db.ReadTxn()) {
			out = append(out, a.IP.String()+" "+string(a.State))
		}
		return out
	}
	initialized := func() bool { ok, _ := allocs.Initialized(db.ReadTxn()); return ok }

	placed, enisChanged := x.Sync([]ExternalIP{ip("10.0.16.11"), ip("10.9.9.9")}, true)
	if placed != 1 || initialized() {
		t.Errorf("ENIs not read: placed %d, initialized %t; want 1, false", placed, initialized())
	}
	wtxn = db.WriteTxn(enis)
	enisInit(wtxn)
	wtxn.Commit()
	select {
	case <-enisChanged:
	default:
		t.Fatal("the channel Sync returned is not closed once the ENIs are read")
	}
	x.Sync([]ExternalIP{ip("10.0.16.11"), ip("10.9.9.9")}, false)
	if initialized() {
		t.Error("initialized by an incomplete set")
	}
	x.Sync([]ExternalIP{ip("10.0.16.12")}, true)
	if !initialized() {
		t.Error("not initialized by a complete set with the ENIs read")
	}
	if got, want := rows(), []string{"10.0.16.12 Allocated"}; !slices.Equal(got, want) {
		t.Errorf("rows %v, want %v", got, want)
	}
}

// With the embedding agent's IPAM, pruning removes the owned-shape rules
// (priority 111, proto kernel, from one address into an ENI table) that no
// row desires, of the IPs the agent lists and of the IPs it no longer routes
// to; it keeps those of an IP it routes to and does not list yet (a pod
// between its CNI ADD and its endpoint), and every rule of another priority
// or protocol.
func TestPrivilegedPruneEmbeddingAgentRules(t *testing.T) {
	ns := celltest.NewNetNS(t)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	s := Settings{
		EgressMode: EgressModeCIDR, MasqueradeV4: true, EnableIPv4: true,
		Allocator: nodeconfig.AllocatorCilium,
		PodRules:  nodeconfig.PodRules{IngressPriority: 20, EgressPriority: 111, TableOffset: 10, Protocol: unix.RTPROT_KERNEL},
	}
	listed, routedNew, gone := netip.MustParseAddr("10.0.16.11"), netip.MustParseAddr("10.0.16.12"), netip.MustParseAddr("10.0.16.13")
	tenSlash8, stale := netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16")
	add := func(prio, proto, table int, from, to netip.Prefix) {
		t.Helper()
		r := netlink.NewRule()
		r.Priority, r.Family, r.Table, r.Protocol = prio, unix.AF_INET, table, uint8(proto)
		if from.IsValid() {
			r.Src = ipNet(from)
		}
		if to.IsValid() {
			r.Dst = ipNet(to)
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

	db := statedb.New()
	allocs, err := NewAllocationTable(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(allocs)
	allocs.Insert(wtxn, &Allocation{IP: listed, Owner: "shop/a", ENI: "eni-1", State: StateAllocated})
	wtxn.Commit()
	desired := &Rule{RuleKey: RuleKey{Priority: 111, From: host(listed), To: tenSlash8, Table: 11}, Pod: listed}
	ops := &ruleOps{nl: &nlHandle{Netlink: h, families: []int{unix.AF_INET}}, settings: s, allocs: allocs}
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
