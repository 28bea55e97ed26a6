package podset

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/tablesync"
	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
)

// With the embedding agent's IPAM (nodeconfig.AllocatorCilium), Cilium hands
// out the pod IPs and writes each IP's rules when it configures it (cilium-cni
// at ADD, the agent at endpoint restore and for its router and health IPs),
// with the CIDRs of that moment. enimasq keeps those egress rules in step
// with the ip-masq-agent table: ipam-allocations holds the IPs the embedding
// agent allocated, written by the agent's own pod-set source through
// Writer, and eni-rules their egress rules in the agent's shape.
//
// The pod set is what the agent knows, not what the CiliumNode says: Cilium
// v1.20's ENI multi-pool IPAM keeps no per-IP record in the CiliumNode (it
// clears status.ipam.used). Each IP goes on the ENI whose addresses hold it,
// as Cilium places it (ENI.Holds).

// Writer is the write side of ipam-allocations for the embedding agent's
// pod-set source.
type Writer struct {
	db       *statedb.DB
	allocs   statedb.RWTable[*allocations.Allocation]
	enis     statedb.Table[*ciliumnode.ENI]
	initDone func(statedb.WriteTxn)
}

// IP is an IP that the embedding agent allocated, and to whom.
type IP struct {
	IP    netip.Addr
	Owner string
}

// Sync makes ipam-allocations hold exactly ips, each placed on the usable
// ENI that holds it (Orphaned, with the reason, when none does). With
// complete (the agent's set is whole: its endpoints restored, its router IP
// known) it marks the table initialized once the ENIs are read, which lets
// the rule reconciler prune. It returns the number of IPs placed and a
// channel that is closed when the ENIs change, when the placement is to be
// done again.
func (x *Writer) Sync(ips []IP, complete bool) (placed int, enisChanged <-chan struct{}) {
	wtxn := x.db.WriteTxn(x.allocs)
	defer wtxn.Abort()
	enis, watch := x.enis.AllWatch(wtxn)
	sorted := statedb.Collect(enis)
	slices.SortFunc(sorted, func(a, b *ciliumnode.ENI) int {
		if c := cmp.Compare(a.Number, b.Number); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	enisRead, enisInit := x.enis.Initialized(wtxn)
	if !enisRead {
		watch = enisInit
	}

	desired := make([]*allocations.Allocation, 0, len(ips))
	for _, ip := range ips {
		a := place(ip, sorted)
		if a.State == allocations.StateAllocated {
			placed++
		}
		desired = append(desired, a)
	}
	tablesync.Rows[*allocations.Allocation, netip.Addr]{
		Key:   func(a *allocations.Allocation) netip.Addr { return a.IP },
		Query: allocations.AllocationIPIndex.Query,
		Same:  func(old, want *allocations.Allocation) bool { return *old == *want },
	}.Sync(wtxn, x.allocs, desired)
	if complete && enisRead && x.initDone != nil {
		x.initDone(wtxn)
		x.initDone = nil
	}
	wtxn.Commit()
	return placed, watch
}

// place is the allocation of ip: on the first usable ENI (by number) that
// holds it.
func place(ip IP, enis []*ciliumnode.ENI) *allocations.Allocation {
	a := &allocations.Allocation{IP: ip.IP, Owner: ip.Owner, State: allocations.StateOrphaned}
	var skipped *ciliumnode.ENI
	for _, e := range enis {
		if !e.Holds(ip.IP) {
			continue
		}
		if !e.Usable() {
			skipped = e
			continue
		}
		a.ENI, a.State = e.ID, allocations.StateAllocated
		return a
	}
	if skipped != nil {
		a.Reason = fmt.Sprintf("%s is on %s, which is skipped (%s): no rules kept", ip.IP, skipped.ID, skipped.Skipped)
	} else {
		a.Reason = fmt.Sprintf("no ENI of the CiliumNode holds %s (status.eni.enis[].addresses): no rules kept", ip.IP)
	}
	return a
}
