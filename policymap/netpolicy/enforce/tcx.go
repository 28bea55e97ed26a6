package enforce

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// tcxLinks are the tcx links the agent holds open, by device and side: a
// held link stays attached whatever happens to its pin (deleted, or its
// bpffs unmounted); the pin only carries it across a restart.
type tcxLinks struct {
	mu    sync.Mutex
	links map[tcxKey]*heldLink
}

type tcxKey struct{ device, side string }

type heldLink struct {
	link link.Link
	id   link.ID
	// pinned is set once the link was pinned by this run (or adopted
	// from its pin): a pin gone after that is logged when put back.
	pinned bool
	// intruders are the foreign programs found ahead of enimasq's on the
	// hook, by program ID: the row is an error while any of them stays
	// attached, even though enimasq's was put back first.
	intruders map[ebpf.ProgramID]string
	// bypassForgotten are the intruders the device's connections were
	// forgotten for (forgetBypassed), while they stay attached.
	bypassForgotten map[ebpf.ProgramID]bool
	// renamedFrom is the device's name before a rename, when the link
	// was taken over from the row of that name (adoptRenamed).
	renamedFrom string
}

func (t *tcxLinks) set(k tcxKey, h *heldLink) {
	if t.links == nil {
		t.links = map[tcxKey]*heldLink{}
	}
	t.links[k] = h
}

func (o *ops) pinPath(device string, h hook) string {
	return filepath.Join(o.settings.LinksDir, device+"_"+h.name)
}

// attachTCX keeps a tcx link of prog on the hook, first in the device's
// chain, held open and pinned. The link held, or else the pinned one (an
// earlier run's), if it is still attached to this ifindex, is moved to
// prog; else (the device made again, the link detached by hand) a new one
// is attached at the head. A foreign program found ahead of it is an
// error naming the program, and enimasq's is put back first; a pin gone
// (deleted, bpffs remounted) is made again.
func (o *ops) attachTCX(a *Attachment, h hook, prog *ebpf.Program) error {
	o.tcx.mu.Lock()
	defer o.tcx.mu.Unlock()
	key, path := tcxKey{a.Device, h.name}, o.pinPath(a.Device, h)
	held := o.tcx.links[key]
	if held != nil && !onHook(held.link, a, h) {
		o.log.Info("Policy program no longer on the pod's device (detached, or the device made again): attaching it again",
			"device", a.Device, "ifindex", a.Ifindex, "side", h.name)
		o.dropLink(key, path)
		held = nil
	}
	if held == nil {
		held = o.adoptRenamed(a, h, key)
	}
	if held == nil {
		var err error
		if held, err = o.adoptOrAttach(a, h, prog, path); err != nil {
			return err
		}
		o.tcx.set(key, held)
	}
	if err := useProgram(held.link, prog); err != nil {
		return err
	}
	errs := []error{o.keepFirst(a, h, prog, held), o.keepPinned(a, h, held, path)}
	// The other writers' programs behind enimasq's (those that got ahead
	// are keepFirst's) and their tc filters, which tcx runs before.
	others, err := othersOnHook(a.Ifindex, h, held.id, 0, held.intruders)
	if err == nil {
		err = o.othersError(a, h, others)
	}
	return joinLine(append(errs, err)...)
}

// adoptRenamed takes over the link of a device renamed to a.Device (the
// same ifindex): held for its old name, or pinned under it (a restart
// between). The link never leaves the device, so no packet passes
// unjudged across the rename; keepPinned moves its pin to the new name.
// Nil when the device is not named a.Device now (a stale row), or no
// such link is there.
func (o *ops) adoptRenamed(a *Attachment, h hook, key tcxKey) *heldLink {
	l, err := netlink.LinkByIndex(a.Ifindex)
	if err != nil || l.Attrs().Name != a.Device {
		return nil
	}
	for k, held := range o.tcx.links {
		if k.side == h.name && k.device != a.Device && onHook(held.link, a, h) {
			delete(o.tcx.links, k)
			held.pinned = false // its pin is the old name's
			held.renamedFrom = k.device
			o.tcx.set(key, held)
			o.log.Info("Pod device renamed: its policy link follows it", "device", a.Device, "was", k.device, "side", h.name, "ifindex", a.Ifindex)
			return held
		}
	}
	entries, _ := os.ReadDir(o.settings.LinksDir)
	for _, e := range entries {
		device, side, ok := cutLast(e.Name(), "_")
		if !ok || side != h.name || device == a.Device {
			continue
		}
		pl, err := link.LoadPinnedLink(filepath.Join(o.settings.LinksDir, e.Name()), nil)
		if err != nil {
			continue
		}
		if !onHook(pl, a, h) {
			pl.Close()
			continue
		}
		held, err := newHeldLink(pl, false)
		if err != nil {
			continue
		}
		held.renamedFrom = device
		o.tcx.set(key, held)
		o.log.Info("Pod device renamed: its pinned policy link follows it", "device", a.Device, "was", device, "side", h.name, "ifindex", a.Ifindex)
		return held
	}
	return nil
}

// adoptOrAttach returns the pinned link if it is on the hook (a restart:
// it never stopped enforcing), else a new link of prog at the head.
func (o *ops) adoptOrAttach(a *Attachment, h hook, prog *ebpf.Program, path string) (*heldLink, error) {
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		if onHook(l, a, h) {
			return newHeldLink(l, true)
		}
		l.Unpin()
		l.Close()
		o.log.Info("Policy program no longer on the pod's device (detached, or the device made again): attaching it again",
			"device", a.Device, "ifindex", a.Ifindex, "side", h.name)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: a.Ifindex, Program: prog, Attach: h.tcx, Anchor: link.Head()})
	if err != nil {
		return nil, err
	}
	return newHeldLink(l, false)
}

func newHeldLink(l link.Link, pinned bool) (*heldLink, error) {
	info, err := l.Info()
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("link info: %w", err)
	}
	return &heldLink{link: l, id: info.ID, pinned: pinned, intruders: map[ebpf.ProgramID]string{}, bypassForgotten: map[ebpf.ProgramID]bool{}}, nil
}

// onHook says whether l is attached to the device's hook (a link whose
// device went, or detached by hand, has ifindex 0).
func onHook(l link.Link, a *Attachment, h hook) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	tcx := info.TCX()
	return tcx != nil && int(tcx.Ifindex) == a.Ifindex && ebpf.AttachType(tcx.AttachType) == h.tcx
}

// useProgram moves l to prog if it holds another program.
func useProgram(l link.Link, prog *ebpf.Program) error {
	info, err := l.Info()
	if err != nil {
		return fmt.Errorf("link info: %w", err)
	}
	pinfo, err := prog.Info()
	if err != nil {
		return fmt.Errorf("program info: %w", err)
	}
	if id, _ := pinfo.ID(); id == info.Program {
		return nil
	}
	if err := l.Update(prog); err != nil {
		return fmt.Errorf("move the link to the new program: %w", err)
	}
	return nil
}

// keepFirst asks the kernel for the hook's chain: a program ahead of
// enimasq's (another writer's, attached before it) would decide the packets
// first (TCX_PASS ends the chain). Enimasq's is put back first with a new
// link at the head, the old one detached; the foreign program is left where
// it is, and named in the error while it stays attached.
func (o *ops) keepFirst(a *Attachment, h hook, prog *ebpf.Program, held *heldLink) error {
	chain, err := link.QueryPrograms(link.QueryOptions{Target: a.Ifindex, Attach: h.tcx})
	if err != nil {
		return fmt.Errorf("query the tcx programs: %w", err)
	}
	pos := slices.IndexFunc(chain.Programs, func(p link.AttachedProgram) bool {
		id, _ := p.LinkID()
		return id == held.id
	})
	if pos < 0 {
		return fmt.Errorf("enimasq's link %d is not in the kernel's tcx chain", held.id)
	}
	attached := map[ebpf.ProgramID]bool{}
	for _, p := range chain.Programs {
		attached[p.ID] = true
	}
	maps.DeleteFunc(held.intruders, func(id ebpf.ProgramID, _ string) bool { return !attached[id] })
	maps.DeleteFunc(held.bypassForgotten, func(id ebpf.ProgramID, _ bool) bool { return !attached[id] })
	var moveErr error
	if ahead := chain.Programs[:pos]; len(ahead) > 0 {
		// The connections are forgotten once a foreign program got ahead,
		// not at each retry while it stays attached (each would wipe the
		// device's connections again: replies the policy allows, denied
		// once their entries are gone).
		forget := false
		for _, p := range ahead {
			held.intruders[p.ID] = describeProgram(p)
			forget = forget || !held.bypassForgotten[p.ID]
		}
		o.log.Warn("A foreign tcx program is ahead of enimasq's policy program: putting enimasq's back first",
			"device", a.Device, "ifindex", a.Ifindex, "side", h.name, "foreign", strings.Join(describeAll(held.intruders), ", "))
		moveErr = o.moveToHead(a, h, prog, held)
		if moveErr == nil && forget {
			if moveErr = o.forgetBypassed(a); moveErr == nil {
				for _, p := range ahead {
					held.bypassForgotten[p.ID] = true
				}
			}
		}
	}
	if len(held.intruders) == 0 {
		return moveErr
	}
	return errors.Join(fmt.Errorf("foreign tcx %s on the %s (%s) got ahead of enimasq's policy program: enimasq's is put back first, and this is an error while it stays attached",
		strings.Join(describeAll(held.intruders), ", "), h.name, h.tcx), moveErr)
}

// moveToHead puts enimasq's program back at the head of the chain. A
// program can be on a hook once only, and a link keeps its place: a new
// link of a drop-all placeholder goes to the head, the old link (behind the
// foreign program) is detached, and the new link is moved to prog. For the
// microseconds between, the device drops everything (fail closed). The new
// link is pinned by keepPinned.
func (o *ops) moveToHead(a *Attachment, h hook, prog *ebpf.Program, held *heldLink) error {
	guard, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "enimasq_guard", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}, // TCX_DROP
	})
	if err != nil {
		return fmt.Errorf("put enimasq's program back first: load the placeholder: %w", err)
	}
	defer guard.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: a.Ifindex, Program: guard, Attach: h.tcx, Anchor: link.Head()})
	if err != nil {
		return fmt.Errorf("put enimasq's program back first: %w", err)
	}
	info, err := l.Info()
	if err != nil {
		l.Close()
		return fmt.Errorf("put enimasq's program back first: link info: %w", err)
	}
	old := held.link
	held.link, held.id, held.pinned = l, info.ID, false
	var errs []error
	if err := old.Detach(); err != nil {
		errs = append(errs, fmt.Errorf("detach enimasq's link behind the foreign program: %w", err))
	}
	if err := old.Unpin(); err != nil {
		errs = append(errs, fmt.Errorf("unpin enimasq's old link: %w", err))
	}
	old.Close()
	if err := useProgram(l, prog); err != nil {
		// The placeholder stays first and drops: the retry moves it.
		errs = append(errs, fmt.Errorf("put enimasq's program back first: %w", err))
	}
	return errors.Join(errs...)
}

// forgetBypassed forgets the connections tracked on the device: while the
// foreign program decided, the programs tracked what it let through (the
// pod's answers to a peer its policy denies), and those entries would let
// that peer's next connections in as replies. Connections the policy
// allows are tracked again from their next packet.
func (o *ops) forgetBypassed(a *Attachment) error {
	ct, err := o.progs.ct()
	if err != nil {
		return fmt.Errorf("policy programs: %w", err)
	}
	n, err := forgetPolicyConnections(ct, func(c policybpf.PolicyConnection) bool { return int(c.Ifindex) == a.Ifindex })
	o.log.Info("Forgot the connections tracked on the device while a foreign program was ahead",
		"device", a.Device, "ifindex", a.Ifindex, "connections", n)
	if err != nil {
		return fmt.Errorf("forget the connections tracked on %s while a foreign program was ahead: %w", a.Device, err)
	}
	return nil
}

// describeProgram names an attached program: ID, name and link.
func describeProgram(p link.AttachedProgram) string {
	name := "?"
	if prog, err := ebpf.NewProgramFromID(p.ID); err == nil {
		if info, err := prog.Info(); err == nil {
			name = info.Name
		}
		prog.Close()
	}
	s := fmt.Sprintf("program %d %q", p.ID, name)
	if id, ok := p.LinkID(); ok {
		s += fmt.Sprintf(" (link %d)", id)
	}
	return s
}

func describeAll(programs map[ebpf.ProgramID]string) []string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(programs)) {
		out = append(out, programs[id])
	}
	return out
}

// keepPinned pins the held link at path unless it is pinned there already:
// the pin deleted, or gone with a bpffs remount, is made again.
func (o *ops) keepPinned(a *Attachment, h hook, held *heldLink, path string) error {
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		info, err := l.Info()
		l.Close()
		if err == nil && info.ID == held.id {
			return nil
		}
	}
	if err := os.MkdirAll(o.settings.LinksDir, 0o700); err != nil {
		return fmt.Errorf("pin the link: %w", err)
	}
	// Whatever is at the path is not the held link: an old link's pin.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("pin the link: %w", err)
	}
	if err := held.link.Unpin(); err != nil { // forgets the path it had
		return fmt.Errorf("pin the link: %w", err)
	}
	if err := held.link.Pin(path); err != nil {
		return fmt.Errorf("pin the link at %s: %w", path, err)
	}
	if held.pinned {
		o.log.Info("The pin of a policy link was gone (deleted, or bpffs mounted again): pinned again",
			"device", a.Device, "side", h.name, "pin", path)
	}
	held.pinned = true
	return nil
}

// dropLink detaches and forgets the held link of key, and removes its pin.
func (o *ops) dropLink(key tcxKey, path string) error {
	var errs []error
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if held := o.tcx.links[key]; held != nil {
		delete(o.tcx.links, key)
		if info, err := held.link.Info(); err == nil && info.TCX() != nil && info.TCX().Ifindex != 0 {
			if err := held.link.Detach(); err != nil {
				errs = append(errs, err)
			}
		}
		held.link.Close()
	}
	return errors.Join(errs...)
}

// detach takes enimasq's link off the device's hook: the held link is
// detached, and the pin removed (a link only pinned, an earlier run's,
// held by nothing else, goes and detaches).
func (o *ops) detach(device string, h hook) error {
	o.tcx.mu.Lock()
	defer o.tcx.mu.Unlock()
	if err := o.dropLink(tcxKey{device, h.name}, o.pinPath(device, h)); err != nil {
		return fmt.Errorf("detach from the %s of %s: %w", h.name, device, err)
	}
	return nil
}

// closeLinks lets the held links go, their pins keeping them attached (the
// agent stops).
func (o *ops) closeLinks() {
	o.tcx.mu.Lock()
	defer o.tcx.mu.Unlock()
	for k, held := range o.tcx.links {
		held.link.Close()
		delete(o.tcx.links, k)
	}
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// pruneLinks removes enimasq's links (held, and pins) of the devices
// desired is false for.
func (o *ops) pruneLinks(desired map[string]bool) error {
	entries, err := os.ReadDir(o.settings.LinksDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	stale := map[tcxKey]bool{}
	for _, e := range entries {
		if device, side, ok := cutLast(e.Name(), "_"); ok && !desired[device] {
			stale[tcxKey{device, side}] = true
		}
	}
	o.tcx.mu.Lock()
	for k := range o.tcx.links {
		if !desired[k.device] {
			stale[k] = true
		}
	}
	o.tcx.mu.Unlock()
	var errs []error
	for k := range stale {
		for _, h := range hooks {
			if h.name == k.side {
				errs = append(errs, o.detach(k.device, h))
			}
		}
	}
	return errors.Join(errs...)
}
