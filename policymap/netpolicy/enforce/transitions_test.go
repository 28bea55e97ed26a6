package enforce

import (
	"context"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// countForgets counts the walks of the connection-tracking map that
// forget the connections of ifindex (those forgetBypassed does).
func countForgets(t *testing.T, ifindex int) func() int {
	t.Helper()
	var mu sync.Mutex
	n := 0
	real := forgetPolicyConnections
	forgetPolicyConnections = func(m *ebpf.Map, forget func(policybpf.PolicyConnection) bool) (int, error) {
		if forget(policybpf.PolicyConnection{Ifindex: uint32(ifindex)}) {
			mu.Lock()
			n++
			mu.Unlock()
		}
		return real(m, forget)
	}
	t.Cleanup(func() { forgetPolicyConnections = real })
	return func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// A foreign program that takes the tcx head again and again (another
// enforcer that insists on being first) makes enimasq put its own back
// first at each retry, and forget the device's connections once, when it
// first got ahead: not at every retry. Another program getting ahead is
// another transition, and forgets again.
func TestPrivilegedTCXForeignAheadForgetsOnce(t *testing.T) {
	e := newTCXEnv(t)
	forgets := countForgets(t, e.att.Ifindex)
	if err := e.update(e.ops); err != nil {
		t.Fatal(err)
	}
	egress := hooks[1]
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "foreign_pass", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	var foreign link.Link
	takeHead := func() {
		t.Helper()
		if foreign != nil {
			foreign.Close()
		}
		err := e.in(func() (err error) {
			foreign, err = link.AttachTCX(link.TCXOptions{Interface: e.att.Ifindex, Program: prog, Attach: egress.tcx, Anchor: link.Head()})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	defer func() { foreign.Close() }()
	for retry := range 5 {
		takeHead()
		if err := e.update(e.ops); err == nil {
			t.Fatalf("retry %d with the foreign program ahead: no error", retry)
		}
		if got := e.position(egress, e.ours(egress)); got != 0 {
			t.Fatalf("retry %d: enimasq's program at %d of %v, want first", retry, got, e.chain(egress))
		}
	}
	if n := forgets(); n != 1 {
		t.Errorf("the device's connections forgotten %d times over 5 retries with the foreign program ahead, want once", n)
	}
	// Its retries with the foreign program behind forget nothing either.
	for range 3 {
		e.update(e.ops)
	}
	if n := forgets(); n != 1 {
		t.Errorf("forgotten %d times, want once", n)
	}
	// Another foreign program getting ahead is another transition.
	other, _ := e.attachForeign(egress, link.Head())
	e.update(e.ops)
	if n := forgets(); n != 2 {
		t.Errorf("another foreign program ahead: forgotten %d times in all, want 2", n)
	}
	other.Close()
	foreign.Close()
	foreign = nil
	if err := e.update(e.ops); err != nil {
		t.Errorf("the foreign programs gone: %s", err)
	}
	// Gone and back: a transition again.
	takeHead()
	e.update(e.ops)
	if n := forgets(); n != 3 {
		t.Errorf("the foreign program back after it left: forgotten %d times in all, want 3", n)
	}
}

// rename renames the env's device (down, as the kernel requires) and
// returns the attachment of its new name (same ifindex).
func (e *tcxEnv) rename(to string) *Attachment {
	e.t.Helper()
	err := e.in(func() error {
		l, err := netlink.LinkByIndex(e.att.Ifindex)
		if err != nil {
			return err
		}
		netlink.LinkSetDown(l)
		return netlink.LinkSetName(l, to)
	})
	if err != nil {
		e.t.Fatalf("rename: %s", err)
	}
	return &Attachment{Device: to, Ifindex: e.att.Ifindex, Pods: e.att.Pods}
}

// A pod's device renamed (same ifindex): the derived rows are the old
// name's deleted and the new name's added, in either order; enimasq's
// programs never leave the device (the same links, moved to the new
// name's row and pin), and no second link of enimasq's is added.
func TestPrivilegedTCXRenameKeepsPrograms(t *testing.T) {
	for _, deleteFirst := range []bool{true, false} {
		name := "delete-then-add"
		if !deleteFirst {
			name = "add-then-delete"
		}
		t.Run(name, func(t *testing.T) {
			e := newTCXEnv(t)
			forgets := countForgets(t, e.att.Ifindex)
			if err := e.update(e.ops); err != nil {
				t.Fatal(err)
			}
			links := map[string]link.ID{}
			for _, h := range hooks {
				links[h.name] = e.pinnedLink(h)
			}
			old := e.att
			renamed := e.rename("enqpod1")
			onDevice := func(when string) {
				t.Helper()
				for _, h := range hooks {
					chain := e.chain(h)
					if len(chain) != 1 || chain[0].ID != e.ours(h) {
						t.Errorf("%s: %s chain %v, want enimasq's program alone, never gone", when, h.name, chain)
					}
				}
			}
			del := func() {
				t.Helper()
				if err := e.in(func() error { return e.ops.Delete(context.Background(), nil, 0, old) }); err != nil {
					t.Errorf("delete the old name's row: %s", err)
				}
				onDevice("after the old name's row was deleted")
			}
			add := func() {
				t.Helper()
				if err := e.in(func() error { return e.ops.Update(context.Background(), nil, 0, renamed) }); err != nil {
					t.Errorf("add the new name's row: %s", err)
				}
				onDevice("after the new name's row was added")
			}
			if deleteFirst {
				del()
				add()
			} else {
				add()
				del()
			}
			e.att = renamed
			for _, h := range hooks {
				if got := e.pinnedLink(h); got != links[h.name] {
					t.Errorf("%s: pinned link %d under the new name, want the same link %d", h.name, got, links[h.name])
				}
				if pinnedLinkID(e.ops.pinPath(old.Device, h)) != 0 {
					t.Errorf("%s: the old name's pin is still there", h.name)
				}
			}
			if n := forgets(); n != 0 {
				t.Errorf("the rename forgot the device's connections %d times", n)
			}
			// A refresh of the new name's row, and pruning with it desired,
			// keep it as it is.
			if err := e.update(e.ops); err != nil {
				t.Errorf("refresh: %s", err)
			}
			err := e.in(func() error {
				return e.ops.Prune(context.Background(), nil, func(yield func(*Attachment, uint64) bool) { yield(renamed, 0) })
			})
			if err != nil {
				t.Errorf("prune: %s", err)
			}
			onDevice("after a refresh and a prune")
		})
	}
}

// An agent restarted across a rename finds the link pinned under the old
// name and adopts it for the new one: no second link, no gap.
func TestPrivilegedTCXRenameAcrossRestart(t *testing.T) {
	e := newTCXEnv(t)
	if err := e.update(e.ops); err != nil {
		t.Fatal(err)
	}
	links := map[string]link.ID{}
	for _, h := range hooks {
		links[h.name] = e.pinnedLink(h)
	}
	e.ops.closeLinks() // the agent stops: the pins hold the links
	e.att = e.rename("enqpod1")
	restarted := e.newOps()
	e.ops = restarted
	if err := e.update(restarted); err != nil {
		t.Fatalf("restart: %s", err)
	}
	for _, h := range hooks {
		chain := e.chain(h)
		if len(chain) != 1 || e.pinnedLink(h) != links[h.name] {
			t.Errorf("%s: chain %v, pinned link %d: want the old link %d alone, adopted", h.name, chain, e.pinnedLink(h), links[h.name])
		}
	}
}
