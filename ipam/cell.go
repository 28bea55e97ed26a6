package ipam

import (
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/allocator"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipam/datapath"
	"github.com/enimasq/enimasq/ipam/podset"
)

// Cell is the ENI IPAM, composed of its parts, which meet through tables:
//
//   - ciliumnode: the CiliumNode → enis;
//   - allocations: the ipam-allocations table, written by one of
//   - allocator: enimasq's allocator, its CNI API and checkpoint, or
//   - podset: the embedding agent's pod set (*podset.Writer, fed by the
//     agent's glue);
//   - datapath: eni-rules and eni-routes from enis, ipam-allocations and
//     ip-masq-agent-cidrs, reconciled with netlink.
//
// Which writer runs, and what of a pod's datapath is enimasq's, follows from
// who allocates (nodeconfig.IPAM.Allocator); this cell alone decides it
// (NewSettings). It needs statedb, jobs, health, nodeconfig.Config and the
// ip-masq-agent-cidrs table (ipmasq.Cell).
var Cell = cell.Module(
	"ipam",
	"ENI IPAM - pod IPs from the CiliumNode and their ip rules and routes",

	cell.Config(DefaultConfig),
	cell.ProvidePrivate(
		newPartSettings,
		// A CNI ADD waits for the datapath's rules.
		func(p *datapath.Programmed) allocator.Programmed { return p },
	),
	ciliumnode.Cell,
	allocations.Cell,
	allocator.Cell,
	podset.Cell,
	datapath.Cell,
	cell.Invoke(initializeWhenOff),
)

// initializeWhenOff initializes ipam-allocations when neither writer runs
// (the IPAM mode is not ENI), so that nothing waits for it.
func initializeWhenOff(a allocator.Settings, p podset.Settings, db *statedb.DB, allocs statedb.RWTable[*allocations.Allocation]) {
	if a.Off == "" || p.Off == "" {
		return
	}
	wtxn := db.WriteTxn(allocs)
	allocs.RegisterInitializer(wtxn, "ipam-off")(wtxn)
	wtxn.Commit()
}
