package enforce

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
)

// tcxEnv is a veth pair in a netns of its own, a private bpffs, and the
// attachment ops on the pair's first device.
type tcxEnv struct {
	t     *testing.T
	ns    netns.NsHandle
	bpffs string
	maps  map[string]*ebpf.Map
	ops   *ops
	att   *Attachment
}

func newTCXEnv(t *testing.T) *tcxEnv {
	t.Helper()
	celltest.RequireRoot(t)
	e := &tcxEnv{t: t, bpffs: celltest.MountBPFFS(t), ns: celltest.NewNetNS(t), maps: map[string]*ebpf.Map{}}
	h, err := netlink.NewHandleAt(e.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "enqpod0"}, PeerName: "enqpeer0"}); err != nil {
		t.Fatalf("veth: %s", err)
	}
	dev, err := h.LinkByName("enqpod0")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range policybpf.PolicyMapNames {
		d, f, _ := policybpf.ParsePolicyMapName(name)
		m, err := ebpf.NewMap(policybpf.PolicyMapSpec(d, f, 16))
		if err != nil {
			t.Fatalf("policy map %s: %s", name, err)
		}
		t.Cleanup(func() { m.Close() })
		e.maps[name] = m
	}
	e.att = &Attachment{Device: "enqpod0", Ifindex: dev.Attrs().Index}
	e.ops = e.newOps()
	return e
}

// newOps are the ops of a (re)started agent on the env's bpffs.
func (e *tcxEnv) newOps() *ops {
	s := Settings{
		Mode: policybpf.PolicyModeStandard, Attach: AttachTCX, CheckInterval: time.Second,
		GlobalsDir: filepath.Join(e.bpffs, "globals"), LinksDir: filepath.Join(e.bpffs, "links"),
	}
	o := &ops{
		log:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		settings: s,
		progs:    &programs{settings: s, maps: func(context.Context) (map[string]*ebpf.Map, error) { return e.maps, nil }},
	}
	e.t.Cleanup(func() { o.closeLinks(); o.progs.close() })
	return o
}

// in runs f on a thread in the env's netns (tcx ifindexes are the netns').
func (e *tcxEnv) in(f func() error) error { return celltest.InNS(e.ns, f) }

// update is the reconciler's Update (a first attach or a refresh).
func (e *tcxEnv) update(o *ops) error {
	return e.in(func() error { return o.Update(context.Background(), nil, 0, e.att) })
}

// chain is the kernel's tcx chain of the device's side, head first.
func (e *tcxEnv) chain(h hook) []link.AttachedProgram {
	e.t.Helper()
	var res *link.QueryResult
	err := e.in(func() (err error) {
		res, err = link.QueryPrograms(link.QueryOptions{Target: e.att.Ifindex, Attach: h.tcx})
		return err
	})
	if err != nil {
		e.t.Fatalf("query the %s chain: %s", h.name, err)
	}
	return res.Programs
}

// ours is the ID of enimasq's program on the side, from the ops' programs.
func (e *tcxEnv) ours(h hook) ebpf.ProgramID {
	e.t.Helper()
	prog, err := e.ops.program(context.Background(), h)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := prog.Info()
	if err != nil {
		e.t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// position is where the program is in the side's chain, -1 if absent.
func (e *tcxEnv) position(h hook, id ebpf.ProgramID) int {
	for i, p := range e.chain(h) {
		if p.ID == id {
			return i
		}
	}
	return -1
}

// pinnedLink is the ID of the link pinned for the side, 0 if none.
func (e *tcxEnv) pinnedLink(h hook) link.ID { return pinnedLinkID(e.ops.pinPath(e.att.Device, h)) }

// attachForeign attaches a program of another writer that returns
// TCX_PASS (it ends the chain: nothing behind it runs) at anchor.
func (e *tcxEnv) attachForeign(h hook, anchor link.Anchor) (link.Link, ebpf.ProgramID) {
	e.t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "foreign_pass", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}, // TCX_PASS
	})
	if err != nil {
		e.t.Fatalf("foreign program: %s", err)
	}
	e.t.Cleanup(func() { prog.Close() })
	var l link.Link
	err = e.in(func() (err error) {
		l, err = link.AttachTCX(link.TCXOptions{Interface: e.att.Ifindex, Program: prog, Attach: h.tcx, Anchor: anchor})
		return err
	})
	if err != nil {
		e.t.Fatalf("attach the foreign program to the %s: %s", h.name, err)
	}
	e.t.Cleanup(func() { l.Close() })
	info, _ := prog.Info()
	id, _ := info.ID()
	return l, id
}

// A foreign program already on the device stays, behind enimasq's, and
// the row is an error naming it while it stays (foreign.go).
func TestPrivilegedTCXAttachesFirst(t *testing.T) {
	e := newTCXEnv(t)
	var foreign []link.Link
	for _, h := range hooks {
		l, _ := e.attachForeign(h, link.Head())
		foreign = append(foreign, l)
	}
	err := e.update(e.ops)
	if err == nil || !strings.Contains(err.Error(), `"foreign_pass"`) || !strings.Contains(err.Error(), "another enforcer's tcx program") {
		t.Errorf("attach with a foreign program behind: error %v, want one naming it", err)
	}
	for _, h := range hooks {
		chain := e.chain(h)
		if len(chain) != 2 || chain[0].ID != e.ours(h) {
			t.Errorf("%s chain %v: want enimasq's program %d first, then the foreign one", h.name, chain, e.ours(h))
		}
	}
	for _, l := range foreign {
		l.Close()
	}
	// The foreign programs gone, a refresh is no error.
	if err := e.update(e.ops); err != nil {
		t.Errorf("refresh: %s", err)
	}
}

// A foreign program put ahead of enimasq's later is an error naming it
// (ID, name, side) while it stays attached; enimasq's is first again.
func TestPrivilegedTCXForeignAheadIsError(t *testing.T) {
	e := newTCXEnv(t)
	if err := e.update(e.ops); err != nil {
		t.Fatal(err)
	}
	egress := hooks[1]
	foreign, id := e.attachForeign(egress, link.Head())
	if e.position(egress, id) != 0 {
		t.Fatalf("the foreign program is not first: %v", e.chain(egress))
	}
	err := e.update(e.ops)
	if err == nil {
		t.Fatal("refresh with a foreign program ahead: no error")
	}
	for _, want := range []string{fmt.Sprintf("program %d", id), `"foreign_pass"`, "egress of enqpod0", "on the egress"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "ingress") {
		t.Errorf("the error %q names the ingress, which has no foreign program", err)
	}
	if got := e.position(egress, e.ours(egress)); got != 0 {
		t.Errorf("enimasq's program at %d of the egress chain %v: want first", got, e.chain(egress))
	}
	if n := len(e.chain(egress)); n != 2 {
		t.Errorf("egress chain %v: want enimasq's and the foreign program", e.chain(egress))
	}
	if e.position(egress, id) < 0 {
		t.Error("the foreign program was detached")
	}
	if e.pinnedLink(egress) == 0 {
		t.Error("enimasq's egress link is not pinned")
	}
	if err := e.update(e.ops); err == nil {
		t.Error("refresh with the foreign program still attached (behind): no error")
	}
	foreign.Close()
	if err := e.update(e.ops); err != nil {
		t.Errorf("refresh with the foreign program gone: %s", err)
	}
}

// The agent holds its links: a deleted pin detaches nothing, and is back
// after the next refresh; a restarted agent adopts the pinned links.
func TestPrivilegedTCXPinDeletedKeepsLink(t *testing.T) {
	e := newTCXEnv(t)
	if err := e.update(e.ops); err != nil {
		t.Fatal(err)
	}
	pinned := map[string]link.ID{}
	for _, h := range hooks {
		pinned[h.name] = e.pinnedLink(h)
		if err := os.Remove(e.ops.pinPath(e.att.Device, h)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond) // a link released goes asynchronously
	for _, h := range hooks {
		if e.position(h, e.ours(h)) != 0 {
			t.Errorf("%s: the pin deleted, enimasq's program left the chain %v", h.name, e.chain(h))
		}
	}
	if err := e.update(e.ops); err != nil {
		t.Fatalf("refresh: %s", err)
	}
	for _, h := range hooks {
		if got := e.pinnedLink(h); got != pinned[h.name] {
			t.Errorf("%s: pinned link %d after the refresh, want %d (the link held)", h.name, got, pinned[h.name])
		}
	}

	restarted := e.newOps()
	if err := e.update(restarted); err != nil {
		t.Fatalf("restart: %s", err)
	}
	for _, h := range hooks {
		if got := e.pinnedLink(h); got != pinned[h.name] || len(e.chain(h)) != 1 {
			t.Errorf("%s after a restart: pinned link %d, chain %v: want link %d adopted", h.name, got, e.chain(h), pinned[h.name])
		}
	}
}

// A bpffs unmounted and mounted again loses the pins, not the programs;
// the next refresh pins them again.
func TestPrivilegedTCXBPFFSRemount(t *testing.T) {
	e := newTCXEnv(t)
	if err := e.update(e.ops); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(e.bpffs, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpffs", e.bpffs, "bpf", 0, "mode=0700"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	for _, h := range hooks {
		if e.pinnedLink(h) != 0 {
			t.Fatalf("%s: a pin survived the remount", h.name)
		}
		if e.position(h, e.ours(h)) != 0 {
			t.Errorf("%s: bpffs remounted, enimasq's program left the chain %v", h.name, e.chain(h))
		}
	}
	if err := e.update(e.ops); err != nil {
		t.Fatalf("refresh after the remount: %s", err)
	}
	for _, h := range hooks {
		if e.pinnedLink(h) == 0 {
			t.Errorf("%s: not pinned again after the remount", h.name)
		}
	}
}

// Held links go with their row (Delete) and with pruning, pinned or not.
func TestPrivilegedTCXDetachHeldLinks(t *testing.T) {
	e := newTCXEnv(t)
	if err := e.update(e.ops); err != nil {
		t.Fatal(err)
	}
	if err := e.in(func() error { return e.ops.Delete(context.Background(), nil, 0, e.att) }); err != nil {
		t.Fatalf("delete: %s", err)
	}
	for _, h := range hooks {
		if chain := e.chain(h); len(chain) != 0 {
			t.Errorf("%s after Delete: chain %v", h.name, chain)
		}
	}
	if err := e.update(e.ops); err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		os.Remove(e.ops.pinPath(e.att.Device, h)) // held only
	}
	if err := e.in(func() error { return e.ops.Prune(context.Background(), nil, func(func(*Attachment, uint64) bool) {}) }); err != nil {
		t.Fatalf("prune: %s", err)
	}
	time.Sleep(100 * time.Millisecond)
	for _, h := range hooks {
		if chain := e.chain(h); len(chain) != 0 {
			t.Errorf("%s after pruning the unpinned links: chain %v", h.name, chain)
		}
	}
}
