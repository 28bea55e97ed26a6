package nodeips

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/enimasq/enimasq/cells/tablesync"
)

// Cell provides node-ips (writable: other sources add their rows) and fills
// it with the addresses of the agent's network namespace.
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
	Jobs  job.Group
	// NS, when provided, is the network namespace to watch instead of the
	// agent's (tests).
	NS *netns.NsHandle `optional:"true"`
}

// registerWatcher adds the job that keeps the netlink rows equal to the
// interfaces' addresses: it lists them at start and again after every
// address notification. The table is initialized after the first list.
func registerWatcher(p watcherParams) {
	wtxn := p.DB.WriteTxn(p.Table)
	initDone := p.Table.RegisterInitializer(wtxn, "node-ips-netlink")
	wtxn.Commit()
	p.Jobs.Add(job.OneShot("watch-addresses", func(ctx context.Context, health cell.Health) error {
		nl, err := handleAt(p.NS)
		if err != nil {
			return err
		}
		defer nl.Close()
		updates := make(chan netlink.AddrUpdate, 64)
		if err := netlink.AddrSubscribeWithOptions(updates, ctx.Done(), netlink.AddrSubscribeOptions{Namespace: p.NS}); err != nil {
			return fmt.Errorf("subscribe to address changes: %w", err)
		}
		initialized := false
		for {
			addrs, err := interfaceAddresses(nl)
			if err != nil {
				health.Degraded("Cannot list the node's addresses", err)
			} else {
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
			}
			select {
			case <-ctx.Done():
				return nil
			case _, ok := <-updates:
				if !ok {
					return fmt.Errorf("address notifications stopped")
				}
			}
			// A burst of changes (an interface going down) is one list.
			for drained := false; !drained; {
				select {
				case <-updates:
				default:
					drained = true
				}
			}
		}
	}))
}

// handleAt is a netlink handle in ns, or in the agent's namespace.
func handleAt(ns *netns.NsHandle) (*netlink.Handle, error) {
	if ns == nil {
		return netlink.NewHandle()
	}
	h, err := netlink.NewHandleAt(*ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", ns, err)
	}
	return h, nil
}

// interfaceAddresses are the addresses of the interfaces nl sees, loopback
// excluded.
func interfaceAddresses(nl *netlink.Handle) ([]*NodeIP, error) {
	addrs, err := nl.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list the node's addresses: %w", err)
	}
	var out []*NodeIP
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap().IsLoopback() {
			continue
		}
		dev := a.Label
		if link, err := nl.LinkByIndex(a.LinkIndex); err == nil {
			dev = link.Attrs().Name
		}
		out = append(out, &NodeIP{Addr: ip.Unmap(), Source: SourceNetlink, Device: dev})
	}
	return out, nil
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
