package enforce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/nldump"
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
// route comes or goes.
type deriver struct {
	log      *slog.Logger
	db       *statedb.DB
	table    statedb.RWTable[*Attachment]
	bindings statedb.RWTable[*Binding]
	pods     SelectedPods
	settings Settings
	initDone func(statedb.WriteTxn)
}

func (d *deriver) run(ctx context.Context, health cell.Health) error {
	done := make(chan struct{})
	defer close(done)
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	links := make(chan netlink.LinkUpdate, 128)
	routes := make(chan netlink.RouteUpdate, 128)
	lost := func(error) { notify() }
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{ErrorCallback: lost}); err != nil {
		return fmt.Errorf("subscribe to link changes: %w", err)
	}
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{ErrorCallback: lost}); err != nil {
		return fmt.Errorf("subscribe to route changes: %w", err)
	}
	go func() {
		// Drain both subscriptions until done; one that ends (its socket
		// failed) is left to the periodic derive.
		links, routes := links, routes
		for links != nil || routes != nil {
			select {
			case <-done:
				return
			case _, ok := <-links:
				if !ok {
					links = nil
					continue
				}
				notify()
			case _, ok := <-routes:
				if !ok {
					routes = nil
					continue
				}
				notify()
			}
		}
	}()

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
		rows, bindings, err := d.desired()
		if err != nil {
			health.Degraded("listing the pods' devices", err)
		} else {
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
			health.OK(fmt.Sprintf("%d pod devices to enforce on (%s mode)", len(rows), d.settings.Mode))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-changed:
			// A burst of changes (a pod's veth and routes made) is one
			// derive.
			time.Sleep(2 * time.Millisecond)
			select {
			case <-changed:
			default:
			}
		case <-time.After(d.settings.CheckInterval):
			// Notifications lost without an error: derive anyway.
		}
	}
}

// desired lists the attachments: one per veth that host routes of the main
// table to pods lead to, with every pod address routed to it; and the
// bindings: every pod address routed to a veth.
func (d *deriver) desired() ([]*Attachment, []*Binding, error) {
	routes, err := nldump.RoutesFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, nil, fmt.Errorf("ip route list: %w", err)
	}
	// The lowest metric wins where an address is routed twice, as in the
	// kernel's lookup; then the lowest ifindex.
	slices.SortStableFunc(routes, func(a, b netlink.Route) int {
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
			link, err := netlink.LinkByIndex(r.LinkIndex)
			if errors.As(err, new(netlink.LinkNotFoundError)) {
				continue // gone meanwhile
			}
			if err != nil {
				// Not known to be gone: keep the rows as they are (a row
				// dropped would take the programs off a live device).
				return nil, nil, fmt.Errorf("ip link show index %d: %w", r.LinkIndex, err)
			}
			if link.Type() != "veth" {
				continue // not a pod's device
			}
			a = &Attachment{Device: link.Attrs().Name, Ifindex: r.LinkIndex}
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
	return out, bindings, nil
}
