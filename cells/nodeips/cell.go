package nodeips

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/kernel"
	"github.com/enimasq/enimasq/cells/tablesync"
)

// Cell provides node-ips (writable: other sources add their rows) and fills
// it with the addresses of the agent's network namespace, from kernel-addrs
// (cells/kernel).
var Cell = cell.Module(
	"node-ips",
	"The IP addresses of this node",

	cell.Provide(
		NewTable,
		statedb.RWTable[*NodeIP].ToTable,
	),
	cell.Invoke(registerWatcher),
)

type watcherParams struct {
	cell.In

	Log   *slog.Logger
	DB    *statedb.DB
	Table statedb.RWTable[*NodeIP]
	Addrs statedb.Table[*kernel.Addr]
	Links statedb.Table[*kernel.Link]
	Jobs  job.Group
}

// registerWatcher adds the job that keeps the netlink rows equal to the
// interfaces' addresses: kernel-addrs, with the names of kernel-links. The
// table is initialized once those are.
func registerWatcher(p watcherParams) {
	wtxn := p.DB.WriteTxn(p.Table)
	initDone := p.Table.RegisterInitializer(wtxn, "node-ips-netlink")
	wtxn.Commit()
	p.Jobs.Add(job.OneShot("watch-addresses", func(ctx context.Context, health cell.Health) error {
		initialized := false
		for {
			txn := p.DB.ReadTxn()
			addrsInit, addrsWatch := p.Addrs.Initialized(txn)
			linksInit, linksWatch := p.Links.Initialized(txn)
			if !addrsInit || !linksInit {
				select {
				case <-ctx.Done():
					return nil
				case <-addrsWatch:
				case <-linksWatch:
				}
				continue
			}
			addrs := interfaceAddresses(txn, p.Addrs, p.Links)
			_, addrsWatch = p.Addrs.AllWatch(txn)
			_, linksWatch = p.Links.AllWatch(txn)
			wtxn := p.DB.WriteTxn(p.Table)
			if n := Sync(wtxn, p.Table, SourceNetlink, addrs); n > 0 {
				p.Log.Debug("Node addresses changed", "rows-changed", n)
			}
			if !initialized {
				initDone(wtxn)
				initialized = true
			}
			wtxn.Commit()
			health.OK(fmt.Sprintf("%d addresses on the interfaces", len(addrs)))
			select {
			case <-ctx.Done():
				return nil
			case <-addrsWatch:
			case <-linksWatch:
			}
		}
	}))
}

// interfaceAddresses are the addresses of the interfaces, loopback
// excluded, each with its link's name (or its label).
func interfaceAddresses(txn statedb.ReadTxn, addrs statedb.Table[*kernel.Addr], links statedb.Table[*kernel.Link]) []*NodeIP {
	var out []*NodeIP
	for a := range addrs.All(txn) {
		ip := a.Prefix.Addr().Unmap()
		if ip.IsLoopback() {
			continue
		}
		dev := a.Label
		if link, _, ok := links.Get(txn, kernel.LinkIndex.Query(a.LinkIndex)); ok {
			dev = link.Name
		}
		out = append(out, &NodeIP{Addr: ip, Source: SourceNetlink, Device: dev})
	}
	return out
}

// Sync makes the rows of source equal to addrs (whose Source is source),
// within wtxn, writing only the difference. Each source calls it for its
// own rows.
func Sync(wtxn statedb.WriteTxn, table statedb.RWTable[*NodeIP], source string, addrs []*NodeIP) int {
	return tablesync.Rows[*NodeIP, Key]{
		Key:   (*NodeIP).Key,
		Query: KeyIndex.Query,
		Same:  func(old, want *NodeIP) bool { return *old == *want },
	}.SyncSubset(wtxn, table, table.List(wtxn, SourceIndex.Query(source)), addrs)
}
