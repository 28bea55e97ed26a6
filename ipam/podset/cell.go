package podset

import (
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
)

// Cell provides the *Writer of ipam-allocations for the embedding agent's
// pod set (nil while Settings.Off): the agent's own glue (ciliumlink) says
// which IPs it allocated, and to whom.
var Cell = cell.Group(
	cell.Provide(newWriter),
	// The writer registers its initializer of ipam-allocations even before
	// the agent's glue asks for it.
	cell.Invoke(func(*Writer) {}),
)

// Settings are what the pod set takes.
type Settings struct {
	// Off, when set, says why the embedding agent's pod set is not the
	// source of ipam-allocations (enimasq's allocator is).
	Off string
}

func newWriter(s Settings, db *statedb.DB, allocs statedb.RWTable[*allocations.Allocation], enis statedb.Table[*ciliumnode.ENI]) *Writer {
	if s.Off != "" {
		return nil
	}
	wtxn := db.WriteTxn(allocs)
	initDone := allocs.RegisterInitializer(wtxn, "embedding-agent-pod-set")
	wtxn.Commit()
	return &Writer{db: db, allocs: allocs, enis: enis, initDone: initDone}
}
