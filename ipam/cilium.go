package ipam

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/cilium/hive/cell"

	"github.com/enimasq/enimasq/cells/tablesync"
)

// With Cilium's IPAM (nodeconfig.AllocatorCilium), Cilium hands out the pod
// IPs and cilium-cni writes each pod's rules at ADD, with the CIDRs of that
// moment. enimasq keeps those rules in step with the ip-masq-agent table
// afterwards: ipam-allocations follows the pods that the CiliumNode's
// status.ipam.used lists (Cilium's IPAM writes it), and eni-rules holds
// their egress rules in Cilium's shape, so that a CIDR removed from the
// config leaves the running pods' rules and a CIDR added reaches them.
//
// status.ipam.used is the pod set because it is the one record of Cilium's
// allocations that survives agent restarts, names the ENI of every IP, and
// is already read with the ENIs (no second watch, no import of Cilium's
// endpoint manager into a feature package). A pod that cilium-cni has just
// created and that status.ipam.used does not list yet keeps the rules
// cilium-cni wrote: pruning only looks at the pods the table knows.

// followCilium keeps ipam-allocations equal to the used IPs of the usable
// ENIs, and initializes it once the CiliumNode has been read.
func (a *Allocator) followCilium(ctx context.Context, health cell.Health) error {
	for {
		rtxn := a.db.ReadTxn()
		enis, enisWatch := a.enis.AllWatch(rtxn)
		if ok, initWatch := a.enis.Initialized(rtxn); !ok {
			health.OK("waiting for the CiliumNode")
			select {
			case <-ctx.Done():
				return nil
			case <-initWatch:
				continue
			}
		}
		var desired []*Allocation
		for e := range enis {
			if !e.Usable() {
				continue
			}
			for _, u := range e.Used {
				desired = append(desired, &Allocation{IP: u.IP, Owner: u.Owner, ENI: e.ID, State: StateAllocated})
			}
		}
		wtxn := a.db.WriteTxn(a.allocs)
		tablesync.Rows[*Allocation, netip.Addr]{
			Key:   func(al *Allocation) netip.Addr { return al.IP },
			Query: AllocationIPIndex.Query,
			Same:  func(old, want *Allocation) bool { return *old == *want },
		}.Sync(wtxn, a.allocs, desired)
		if a.restoreDone != nil {
			a.restoreDone(wtxn)
			a.restoreDone = nil
		}
		wtxn.Commit()
		health.OK(fmt.Sprintf("following Cilium's IPAM: %d pods in status.ipam.used", len(desired)))

		select {
		case <-ctx.Done():
			return nil
		case <-enisWatch:
		}
	}
}
