package podset

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
)

var externalENIs = []*ciliumnode.ENI{
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
		a := place(IP{IP: netip.MustParseAddr(tc.ip), Owner: "shop/a"}, externalENIs)
		switch {
		case tc.reason == "" && (a.State != allocations.StateAllocated || a.ENI != tc.eni):
			t.Errorf("%s: %+v, want Allocated on %s", tc.ip, a, tc.eni)
		case tc.reason != "" && (a.State != allocations.StateOrphaned || a.ENI != "" || !strings.Contains(a.Reason, tc.reason)):
			t.Errorf("%s: %+v, want Orphaned: ...%s...", tc.ip, a, tc.reason)
		}
	}
}

// Sync keeps ipam-allocations equal to the set it is given and initializes
// the table only once the set is complete and the ENIs are read: the rule
// reconciler never prunes on a partial set.
func TestExternalAllocationsSync(t *testing.T) {
	db := statedb.New()
	allocs, err := allocations.NewAllocationTable(db)
	if err != nil {
		t.Fatal(err)
	}
	enis, err := ciliumnode.NewTable(db)
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
	x := &Writer{db: db, allocs: allocs, enis: enis, initDone: allocsInit}
	ip := func(s string) IP { return IP{IP: netip.MustParseAddr(s), Owner: "shop/" + s} }
	rows := func() []string {
		var out []string
		for a := range allocs.All(db.ReadTxn()) {
			out = append(out, a.IP.String()+" "+string(a.State))
		}
		return out
	}
	initialized := func() bool { ok, _ := allocs.Initialized(db.ReadTxn()); return ok }

	placed, enisChanged := x.Sync([]IP{ip("10.0.16.11"), ip("10.9.9.9")}, true)
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
	x.Sync([]IP{ip("10.0.16.11"), ip("10.9.9.9")}, false)
	if initialized() {
		t.Error("initialized by an incomplete set")
	}
	x.Sync([]IP{ip("10.0.16.12")}, true)
	if !initialized() {
		t.Error("not initialized by a complete set with the ENIs read")
	}
	if got, want := rows(), []string{"10.0.16.12 Allocated"}; !slices.Equal(got, want) {
		t.Errorf("rows %v, want %v", got, want)
	}
}
