package ipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/tablesync"
)

// With the embedding agent's IPAM (nodeconfig.AllocatorCilium), Cilium hands
// out the pod IPs and writes each IP's rules when it configures it (cilium-cni
// at ADD, the agent at endpoint restore and for its router and health IPs),
// with the CIDRs of that moment. enimasq keeps those egress rules in step
// with the ip-masq-agent table: ipam-allocations holds the IPs the embedding
// agent allocated, written by the agent's own pod-set source through
// ExternalAllocations, and eni-rules their egress rules in the agent's shape.
//
// The pod set is what the agent knows, not what the CiliumNode says: Cilium
// v1.20's ENI multi-pool IPAM keeps no per-IP record in the CiliumNode (it
// clears status.ipam.used). Each IP goes on the ENI whose addresses hold it,
// as Cilium places it (ENI.Holds).

// ExternalAllocations is the write side of ipam-allocations for the
// embedding agent's pod-set source (nil unless nodeconfig.AllocatorCilium).
type ExternalAllocations struct {
	db       *statedb.DB
	allocs   statedb.RWTable[*Allocation]
	enis     statedb.Table[*ENI]
	initDone func(statedb.WriteTxn)
}

// ExternalIP is an IP that the embedding agent allocated, and to whom.
type ExternalIP struct {
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
func (x *ExternalAllocations) Sync(ips []ExternalIP, complete bool) (placed int, enisChanged <-chan struct{}) {
	wtxn := x.db.WriteTxn(x.allocs)
	defer wtxn.Abort()
	enis, watch := x.enis.AllWatch(wtxn)
	sorted := statedb.Collect(enis)
	slices.SortFunc(sorted, func(a, b *ENI) int {
		if c := cmp.Compare(a.Number, b.Number); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	enisRead, enisInit := x.enis.Initialized(wtxn)
	if !enisRead {
		watch = enisInit
	}

	desired := make([]*Allocation, 0, len(ips))
	for _, ip := range ips {
		a := placeExternal(ip, sorted)
		if a.State == StateAllocated {
			placed++
		}
		desired = append(desired, a)
	}
	tablesync.Rows[*Allocation, netip.Addr]{
		Key:   func(a *Allocation) netip.Addr { return a.IP },
		Query: AllocationIPIndex.Query,
		Same:  func(old, want *Allocation) bool { return *old == *want },
	}.Sync(wtxn, x.allocs, desired)
	if complete && enisRead && x.initDone != nil {
		x.initDone(wtxn)
		x.initDone = nil
	}
	wtxn.Commit()
	return placed, watch
}

// placeExternal is the allocation of ip: on the first usable ENI (by
// number) that holds it.
func placeExternal(ip ExternalIP, enis []*ENI) *Allocation {
	a := &Allocation{IP: ip.IP, Owner: ip.Owner, State: StateOrphaned}
	var skipped *ENI
	for _, e := range enis {
		if !e.Holds(ip.IP) {
			continue
		}
		if !e.Usable() {
			skipped = e
			continue
		}
		a.ENI, a.State = e.ID, StateAllocated
		return a
	}
	if skipped != nil {
		a.Reason = fmt.Sprintf("%s is on %s, which is skipped (%s): no rules kept", ip.IP, skipped.ID, skipped.Skipped)
	} else {
		a.Reason = fmt.Sprintf("no ENI of the CiliumNode holds %s (status.eni.enis[].addresses): no rules kept", ip.IP)
	}
	return a
}
