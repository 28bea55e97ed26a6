package enforce

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/kernel"
	"github.com/enimasq/enimasq/cells/tablesync"
)

// deriver keeps policy-attachments equal to the pod devices to enforce on:
// every veth that a host route of the node to a pod leaves by, each with
// every address routed to it, whatever the pods' policies (a pod that no
// policy selects is allowed by the programs in standard mode, and its
// packets still carry one of its own addresses: no pod forges another's,
// or an outside peer's, source past its own device); and
// policy-bindings equal to every pod address routed to a veth, whatever its
// policy. It derives again when the selection changes and when a link or a
// route comes or goes: from the kernel-links and kernel-routes tables
// (cells/kernel), with no subscription or listing of its own.
type deriver struct {
	log      *slog.Logger
	db       *statedb.DB
	table    statedb.RWTable[*Attachment]
	bindings statedb.RWTable[*Binding]
	pods     SelectedPods
	settings Settings
	links    statedb.Table[*kernel.Link]
	routes   statedb.Table[*kernel.Route]
	initDone func(statedb.WriteTxn)
}

func (d *deriver) run(ctx context.Context, health cell.Health) error {
	for {
		txn := d.db.ReadTxn()
		_, initialized, watch := d.pods(txn)
		if !initialized {
			// The policies are not read yet: the attachments of an earlier
			// run stay as they are (nothing is pruned) until they are.
			health.OK("waiting for the PolicyEndpoints")
			select {
			case <-ctx.Done():
				return nil
			case <-watch:
			}
			continue
		}
		linksInit, linksInitWatch := d.links.Initialized(txn)
		routesInit, routesInitWatch := d.routes.Initialized(txn)
		if !linksInit || !routesInit {
			// The kernel's links and routes are not listed yet: an empty
			// list would take the programs off every device.
			select {
			case <-ctx.Done():
				return nil
			case <-linksInitWatch:
			case <-routesInitWatch:
			}
			continue
		}
		rows, bindings := d.desired(txn)
		_, linksWatch := d.links.AllWatch(txn)
		_, routesWatch := d.routes.AllWatch(txn)
		wtxn := d.db.WriteTxn(d.table, d.bindings)
		n := tablesync.Rows[*Attachment, string]{
			Key:    func(a *Attachment) string { return a.Device },
			Query:  DeviceIndex.Query,
			Same:   (*Attachment).sameDesired,
			Insert: func(a *Attachment) *Attachment { return a.SetStatus(reconciler.StatusPending()) },
		}.Sync(wtxn, d.table, rows)
		nb := bindingRows.Sync(wtxn, d.bindings, bindings)
		if n > 0 || nb > 0 {
			d.log.Debug("Pod devices to enforce on changed", "devices", len(rows), "rows-changed", n,
				"bindings", len(bindings), "bindings-changed", nb)
		}
		if d.initDone != nil {
			d.initDone(wtxn)
			d.initDone = nil
		}
		wtxn.Commit()
		health.OK(fmt.Sprintf("%d pod devices to enforce on (%s)", len(rows), d.settings.modeText()))
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-linksWatch:
			settle()
		case <-routesWatch:
			settle()
		}
	}
}

// settle lets a burst of kernel changes (a pod's veth and routes made) land
// in the tables before the next derive: a burst is one derive. Lost
// notifications are cells/kernel's to make up for (it lists again).
func settle() { time.Sleep(2 * time.Millisecond) }

// desired lists the attachments: one per veth that host routes of the main
// table to pods lead to, with every pod address routed to it; and the
// bindings: every pod address routed to a veth. It reads kernel-routes and
// kernel-links (cells/kernel).
func (d *deriver) desired(txn statedb.ReadTxn) ([]*Attachment, []*Binding) {
	var routes []*kernel.Route
	for r := range d.routes.List(txn, kernel.RouteTableIndex.Query(unix.RT_TABLE_MAIN)) {
		routes = append(routes, r)
	}
	// The lowest metric wins where an address is routed twice, as in the
	// kernel's lookup; then the lowest ifindex.
	slices.SortStableFunc(routes, func(a, b *kernel.Route) int {
		if a.Priority != b.Priority {
			return a.Priority - b.Priority
		}
		return a.LinkIndex - b.LinkIndex
	})
	byIndex := map[int]*Attachment{}
	bound := map[netip.Addr]*Binding{}
	for _, r := range routes {
		if r.Dst == nil || r.LinkIndex == 0 {
			continue
		}
		ones, bits := r.Dst.Mask.Size()
		addr, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok || ones != bits {
			continue
		}
		addr = addr.Unmap()
		if bound[addr] != nil {
			continue
		}
		a := byIndex[r.LinkIndex]
		if a == nil {
			link, _, found := d.links.Get(txn, kernel.LinkIndex.Query(r.LinkIndex))
			if !found {
				continue // gone meanwhile
			}
			if link.Type != "veth" {
				continue // not a pod's device
			}
			a = &Attachment{Device: link.Name, Ifindex: r.LinkIndex}
			byIndex[r.LinkIndex] = a
		}
		a.Pods = append(a.Pods, addr)
		bound[addr] = &Binding{Addr: addr, Device: a.Device, Ifindex: a.Ifindex}
	}
	out := make([]*Attachment, 0, len(byIndex))
	for _, a := range byIndex {
		slices.SortFunc(a.Pods, netip.Addr.Compare)
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b *Attachment) int { return a.Ifindex - b.Ifindex })
	bindings := make([]*Binding, 0, len(bound))
	for _, b := range bound {
		bindings = append(bindings, b)
	}
	slices.SortFunc(bindings, func(a, b *Binding) int { return a.Addr.Compare(b.Addr) })
	return out, bindings
}
