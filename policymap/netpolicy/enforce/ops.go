package enforce

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/nldump"
)

// hook is one side of a pod's device: the program that runs there and how
// it is named in pins and errors.
type hook struct {
	name   string // "ingress" or "egress" of the device
	tcx    ebpf.AttachType
	parent uint32 // tc clsact parent
}

var hooks = []hook{
	// What the pod sends enters its host-side device: the pod's egress.
	{name: "ingress", tcx: ebpf.AttachTCXIngress, parent: netlink.HANDLE_MIN_INGRESS},
	// What the pod receives leaves the device: the pod's ingress.
	{name: "egress", tcx: ebpf.AttachTCXEgress, parent: netlink.HANDLE_MIN_EGRESS},
}

// tcFilterName names enimasq's tc filters (the tc fallback), at a priority
// of their own (other writers take 1).
const (
	tcFilterName = "enimasq-policy"
	tcPriority   = 0x3e57
)

// requireClsact checks that the device's ingress qdisc is a clsact: a plain
// ingress qdisc (the bandwidth plugin's) has one hook for both directions.
func requireClsact(ifindex int) error {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return err
	}
	qdiscs, err := nldump.Qdiscs(l)
	if err != nil {
		return fmt.Errorf("tc qdisc list: %w", err)
	}
	for _, q := range qdiscs {
		if q.Attrs().Parent == netlink.HANDLE_CLSACT || q.Attrs().Parent == netlink.HANDLE_INGRESS {
			if q.Type() != "clsact" {
				return fmt.Errorf("the device has a %s qdisc, not clsact: the programs need both of clsact's hooks", q.Type())
			}
		}
	}
	return nil
}

// listFilters lists the tc filters of a link under parent. A device
// without a clsact qdisc has none: the kernel answers an empty list, not
// an error. An error is one, never "no filters" (it would let enimasq
// replace another writer's filter, or take its own for gone). Tests put a
// fault-injecting fake here.
var listFilters = nldump.Filters

// linkGone says whether err means the device is gone (its filters with it).
func linkGone(err error) bool {
	return errors.As(err, new(netlink.LinkNotFoundError)) || errors.Is(err, unix.ENODEV)
}

// notOthersFilter refuses to replace another writer's filter at enimasq's
// priority and handle.
func notOthersFilter(ifindex int, h hook) error {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return err
	}
	filters, err := listFilters(l, h.parent)
	if err != nil {
		return fmt.Errorf("the %s's tc filters: %w", h.name, err)
	}
	for _, f := range filters {
		a := f.Attrs()
		if a.Priority != tcPriority || a.Handle != 1 {
			continue
		}
		if bf, ok := f.(*netlink.BpfFilter); !ok || bf.Name != tcFilterName {
			return fmt.Errorf("another writer's tc filter is at priority %#x, handle 1 on the %s: not replaced", tcPriority, h.name)
		}
	}
	return nil
}

// ops reconciles policy-attachments with the kernel.
type ops struct {
	log      *slog.Logger
	settings Settings
	progs    *programs
	// usedTC is set once a tc filter was written, and until the first
	// prune (filters an earlier run left): only then does pruning look at
	// the devices' filters (a tcx node has none of enimasq's).
	usedTC atomic.Bool
	pruned atomic.Bool
	tcx    tcxLinks // the tcx links held open (tcx.go)
	// others are the other writers' programs last found on each hook
	// (foreign.go), to log them when they change.
	othersMu sync.Mutex
	others   map[tcxKey]string
}

func (o *ops) program(ctx context.Context, h hook) (*ebpf.Program, error) {
	p, err := o.progs.get(ctx)
	if err != nil {
		return nil, err
	}
	egress, ingress := p.Programs()
	if h.name == "ingress" {
		return egress, nil
	}
	return ingress, nil
}

// Update puts the programs on both sides of the device, or checks that they
// are there (a refresh), attached to this ifindex and the current programs.
// The device's pods are bound to it first (policy-bindings binds them too,
// whether or not the device is attached), so that the programs never see a
// pod of the device as foreign.
func (o *ops) Update(ctx context.Context, _ statedb.ReadTxn, _ statedb.Revision, a *Attachment) error {
	pods, err := o.progs.pods()
	if err != nil {
		return fmt.Errorf("policy programs: %w", err)
	}
	// Only where policy-bindings has not bound the pod yet: it owns the
	// map, and an older row of this table must not undo its newer binding
	// (an IP moved to another device).
	for _, pod := range a.Pods {
		err := pods.Update(policybpf.PolicyPodKey(pod), uint32(a.Ifindex), ebpf.UpdateNoExist)
		if err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return fmt.Errorf("bind %s to %s: %w", pod, a.Device, err)
		}
	}
	// Both sides, whatever the first one's error (another writer's
	// program there): the other side is enforced all the same.
	var errs []error
	for _, h := range hooks {
		prog, err := o.program(ctx, h)
		if err != nil {
			return fmt.Errorf("policy programs: %w", err)
		}
		if err := o.attach(a, h, prog); err != nil {
			errs = append(errs, fmt.Errorf("attach to the %s of %s (ifindex %d): %w", h.name, a.Device, a.Ifindex, err))
		}
	}
	return joinLine(errs...)
}

func (o *ops) attach(a *Attachment, h hook, prog *ebpf.Program) error {
	if o.settings.Attach != AttachTC {
		err := o.attachTCX(a, h, prog)
		if err == nil || o.settings.Attach == AttachTCX || !errors.Is(err, ebpf.ErrNotSupported) {
			return err
		}
		// No tcx in this kernel: tc.
	}
	return o.attachTC(a, h, prog)
}

// attachTC keeps a direct-action bpf filter of prog on the device's clsact
// qdisc (kernels without tcx). Filters stay in the kernel across restarts.
func (o *ops) attachTC(a *Attachment, h hook, prog *ebpf.Program) error {
	o.usedTC.Store(true)
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: a.Ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(qdisc); errors.Is(err, unix.EEXIST) {
		// Another writer's qdisc: only clsact has both hooks.
		if err := requireClsact(a.Ifindex); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("add the clsact qdisc: %w", err)
	}
	filter := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: a.Ifindex, Parent: h.parent, Handle: 1, Priority: tcPriority, Protocol: unix.ETH_P_ALL,
		},
		Fd: prog.FD(), Name: tcFilterName, DirectAction: true,
	}
	if err := notOthersFilter(a.Ifindex, h); err != nil {
		return err
	}
	if err := netlink.FilterReplace(filter); err != nil {
		return fmt.Errorf("tc filter replace: %w", err)
	}
	others, err := othersOnHook(a.Ifindex, h, 0, pinnedLinkID(o.pinPath(a.Device, h)), nil)
	if err != nil {
		return err
	}
	return o.othersError(a, h, others)
}

// Delete takes the programs off the device, then forgets its connections.
func (o *ops) Delete(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, a *Attachment) error {
	batch := []reconciler.BatchEntry[*Attachment]{{Object: a, Revision: rev}}
	o.DeleteBatch(ctx, txn, batch)
	return batch[0].Result
}

// DeleteBatch takes the programs off the devices of a reconcile round,
// then forgets their connections in one walk. A device renamed (the same
// ifindex, another name: the row of its new name takes its links over)
// keeps its programs and its connections: no packet passes unjudged.
func (o *ops) DeleteBatch(_ context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[*Attachment]) {
	devices := map[int]bool{}
	var whys []string
	var forgetting []*reconciler.BatchEntry[*Attachment]
	for i := range batch {
		a := batch[i].Object
		batch[i].Result = nil
		link, err := netlink.LinkByIndex(a.Ifindex)
		if err == nil && link.Attrs().Name != a.Device && o.enforcedOn(a, link) {
			o.log.Info("Pod device renamed: its policy programs stay attached, for the row of its new name",
				"device", a.Device, "renamed-to", link.Attrs().Name, "ifindex", a.Ifindex)
			o.forgetOthers(a.Device)
			continue
		}
		var errs []error
		for _, h := range hooks {
			errs = append(errs, o.detach(a.Device, h))
			if err == nil && link.Attrs().Name == a.Device {
				errs = append(errs, deleteTCFilter(a.Ifindex, h))
			}
		}
		o.forgetOthers(a.Device)
		batch[i].Result = errors.Join(errs...)
		// The bindings are policy-bindings' (they hold whether or not the
		// device is attached); the connections tracked on the device go
		// with it, but for those of a pod still bound to it.
		devices[a.Ifindex] = true
		whys = append(whys, fmt.Sprintf("%s (ifindex %d) no longer carries the programs", a.Device, a.Ifindex))
		forgetting = append(forgetting, &batch[i])
	}
	if len(devices) == 0 {
		return
	}
	if err := o.forgetDevices(devices, whys...); err != nil {
		for _, e := range forgetting {
			e.Result = errors.Join(e.Result, err)
		}
	}
}

// UpdateBatch is Update of each row of a reconcile round.
func (o *ops) UpdateBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*Attachment]) {
	for i := range batch {
		batch[i].Result = o.Update(ctx, txn, batch[i].Revision, batch[i].Object)
	}
}

// enforcedOn says whether enimasq's programs are on the device of a's
// ifindex, now named otherwise (a rename): a tcx link held on the
// device's hook (for a's name, or for the new name already), or enimasq's
// tc filter on it.
func (o *ops) enforcedOn(a *Attachment, l netlink.Link) bool {
	o.tcx.mu.Lock()
	for k, held := range o.tcx.links {
		for _, h := range hooks {
			// Held for a's name, or already taken over by the row of
			// the new name (not a new device's that got the ifindex).
			if h.name == k.side && (k.device == a.Device || held.renamedFrom == a.Device) && onHook(held.link, a, h) {
				o.tcx.mu.Unlock()
				return true
			}
		}
	}
	o.tcx.mu.Unlock()
	for _, h := range hooks {
		filters, err := listFilters(l, h.parent)
		if err != nil {
			continue
		}
		for _, f := range filters {
			if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == tcFilterName && f.Attrs().Handle != 0 {
				return true
			}
		}
	}
	return false
}

func deleteTCFilter(ifindex int, h hook) error {
	l, err := netlink.LinkByIndex(ifindex)
	if linkGone(err) {
		return nil // its filters went with it
	}
	if err != nil {
		return fmt.Errorf("ip link show index %d: %w", ifindex, err)
	}
	// No clsact qdisc: an empty list. An error is not "none there".
	filters, err := listFilters(l, h.parent)
	if linkGone(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("the tc filters of the %s of ifindex %d: %w", h.name, ifindex, err)
	}
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == tcFilterName {
			if err := netlink.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("tc filter del on ifindex %d: %w", ifindex, err)
			}
		}
	}
	return nil
}

// Prune removes enimasq's links (pins) and tc filters of devices that no
// row desires; nothing of another writer is looked at.
func (o *ops) Prune(_ context.Context, _ statedb.ReadTxn, objects iter.Seq2[*Attachment, statedb.Revision]) error {
	desired := map[string]bool{}
	for a := range objects {
		desired[a.Device] = true
	}
	var errs []error
	errs = append(errs, o.pruneLinks(desired))
	if o.usedTC.Load() || o.settings.Attach == AttachTC || !o.pruned.Swap(true) {
		errs = append(errs, deleteTCFilters(desired))
	}
	return errors.Join(errs...)
}

// deleteTCFilters deletes enimasq's tc filters from the veths that keep
// is false for.
func deleteTCFilters(keep map[string]bool) error {
	links, err := nldump.Links()
	if err != nil {
		return fmt.Errorf("ip link list: %w", err)
	}
	var errs []error
	for _, l := range links {
		if l.Type() != "veth" || keep[l.Attrs().Name] {
			continue
		}
		for _, h := range hooks {
			errs = append(errs, deleteTCFilter(l.Attrs().Index, h))
		}
	}
	return errors.Join(errs...)
}

// removeAll takes every program of enimasq off the pods' devices: its
// pinned links and its tc filters (network policy turned off).
func removeAll(linksDir string) error {
	errs := []error{os.RemoveAll(linksDir)}
	if _, err := os.Stat(linksDir); err == nil {
		errs = append(errs, fmt.Errorf("%s is still there", linksDir))
	}
	return errors.Join(append(errs, deleteTCFilters(nil))...)
}
