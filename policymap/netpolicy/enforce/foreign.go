package enforce

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// Another enforcer on a pod's device (the AWS network policy agent's tc
// filters on eni* devices, a tcx program of another tool): enimasq's
// programs are attached all the same, and the other writer's are never
// touched. The row is an error naming them while they stay attached:
// the device's packets are not decided by the policies alone (the other
// program, with its own maps, frozen once its agent is off, may drop what
// the policies allow), so the kernel does not hold what the row desires,
// and only Done counts as enforced. On a tcx device enimasq's program is
// first and returns TCX_NEXT for what it allows, so the other writer's
// programs and filters only ever see what the policies allow: enforcement
// is never weaker for them being there. With the tc fallback, a filter at
// a lower priority number than enimasq's runs first and its TC_ACT_OK
// ends the classification: the error says so.

// otherProgram is another writer's program on a hook enimasq attaches to.
type otherProgram struct {
	desc string
	// first is set when it decides the packets before enimasq's program.
	first bool
}

// othersOnHook lists the other writers' programs on the device's hook:
// the tc bpf filters but enimasq's (and but the chain headers the kernel
// lists with handle 0), and the tcx programs but enimasq's link own (0:
// the tc fallback, where every tcx program runs first; enimasq's there is
// only the link an earlier run pinned, pinned). skip are programs
// reported already (keepFirst's intruders).
func othersOnHook(ifindex int, h hook, own, pinned link.ID, skip map[ebpf.ProgramID]string) ([]otherProgram, error) {
	var out []otherProgram
	tc := own == 0
	chain, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: h.tcx})
	switch {
	case err == nil:
		for _, p := range chain.Programs {
			if id, ok := p.LinkID(); ok && (id == own || id == pinned) && id != 0 {
				continue
			}
			if _, reported := skip[p.ID]; reported {
				continue
			}
			out = append(out, otherProgram{desc: "tcx " + describeProgram(p), first: tc})
		}
	case !tc || !errors.Is(err, ebpf.ErrNotSupported):
		return nil, fmt.Errorf("query the tcx programs: %w", err)
	}
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("device of ifindex %d: %w", ifindex, err)
	}
	// No clsact qdisc: an empty list. An error is not "no filters": the
	// row would say Done with another enforcer's filter unseen.
	filters, err := listFilters(l, h.parent)
	if err != nil {
		return nil, fmt.Errorf("the %s's tc filters: %w", h.name, err)
	}
	for _, f := range filters {
		// Only bpf filters enforce (the AWS agent's, Calico's, Cilium's tc
		// programs); a classic filter (the bandwidth plugin's u32 redirect
		// to an ifb) shapes or mirrors, and is not another enforcer.
		a := f.Attrs()
		if bf, ok := f.(*netlink.BpfFilter); !ok || a.Handle == 0 || bf.Name == tcFilterName {
			continue
		}
		// tcx programs run before every tc filter; with the tc fallback a
		// lower priority number runs first (same priority: unknown, so
		// taken as first).
		out = append(out, otherProgram{desc: describeFilter(f), first: tc && a.Priority <= tcPriority})
	}
	return out, nil
}

// describeFilter names a tc filter: its kind, name and program (bpf),
// priority and handle, as `tc filter show` prints them.
func describeFilter(f netlink.Filter) string {
	a := f.Attrs()
	if bf, ok := f.(*netlink.BpfFilter); ok {
		return fmt.Sprintf("tc bpf filter %q (pref %d, handle %#x, program %d)", bf.Name, a.Priority, a.Handle, bf.Id)
	}
	return fmt.Sprintf("tc %s filter (pref %d, handle %#x)", f.Type(), a.Priority, a.Handle)
}

// othersError is the row's error for the other writers' programs on the
// hook (nil for none), and logs them when they change.
func (o *ops) othersError(a *Attachment, h hook, others []otherProgram) error {
	key := tcxKey{a.Device, h.name}
	var descs, first []string
	for _, p := range others {
		descs = append(descs, p.desc)
		if p.first {
			first = append(first, p.desc)
		}
	}
	slices.Sort(descs)
	now := strings.Join(descs, ", ")
	o.othersMu.Lock()
	if o.others == nil {
		o.others = map[tcxKey]string{}
	}
	before := o.others[key]
	if now == "" {
		delete(o.others, key)
	} else {
		o.others[key] = now
	}
	o.othersMu.Unlock()
	if now != before {
		if now == "" {
			o.log.Info("No other writer's program is left beside enimasq's policy program", "device", a.Device, "side", h.name)
		} else {
			o.log.Warn("Another enforcer's programs are on the pod's device: enimasq's is attached too, the other's are left as they are",
				"device", a.Device, "ifindex", a.Ifindex, "side", h.name, "others", now)
		}
	}
	if now == "" {
		return nil
	}
	if len(first) > 0 {
		which := "it"
		if len(first) < len(descs) {
			which = strings.Join(first, ", ")
		}
		return fmt.Errorf("another enforcer's %s on the hook: %s decides before enimasq's filter (pref %#x), and what it passes never reaches enimasq's; not removed (not enimasq's), an error while it stays",
			now, which, tcPriority)
	}
	return fmt.Errorf("another enforcer's %s on the hook: enimasq's program decides first, then it; not removed (not enimasq's), an error while it stays", now)
}

// forgetOthers forgets what was reported of a device that goes.
func (o *ops) forgetOthers(device string) {
	o.othersMu.Lock()
	defer o.othersMu.Unlock()
	for _, h := range hooks {
		delete(o.others, tcxKey{device, h.name})
	}
}

// joinLine is errors.Join on one line ("; " between the errors), for a
// row's error column.
func joinLine(errs ...error) error {
	var format []string
	var args []any
	for _, err := range errs {
		if err != nil {
			format, args = append(format, "%w"), append(args, err)
		}
	}
	if len(args) == 0 {
		return nil
	}
	return fmt.Errorf(strings.Join(format, "; "), args...)
}

// pinnedLinkID is the ID of the link pinned at path (0: none), an earlier
// run's tcx link that the tc fallback finds on the device.
func pinnedLinkID(path string) link.ID {
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		return 0
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return 0
	}
	return info.ID
}
