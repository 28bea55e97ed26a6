package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/enimasq/enimasq/cells/celltest"
)

// Others' programs and enimasq's pins: deleting the link pins lets no
// connection through, and the pins come back at the next check; a foreign
// tcx program returning TCX_PASS (it ends the chain) attached at the head of
// the device's egress does not open the pod once the check has run, and the
// row and health say so, naming it; a bpffs mounted again lets nothing
// through either, and the pins come back.
func TestPrivilegedNetworkPolicyFirstInTheChain(t *testing.T) {
	node := newPolicyNode(t)
	const device = "eni7a6b5c4d3e"
	node.addPod("a", device, podA)
	a, _ := node.startAgent(map[string]string{"a": policyEndpoint("a", podA, []string{"Ingress"}, nil, nil)})
	waitAttached(a, 1)
	reached := func() bool { return node.connect(node.peerNS(), podA, 80) }
	if reached() {
		t.Fatal("the peer reached the pod before anything: its ingress is isolated")
	}

	// Deleting the pins detaches nothing: the agent holds the links.
	links := filepath.Join(a.BPFRoot, "enimasq", "links")
	for _, side := range []string{"ingress", "egress"} {
		if err := os.Remove(filepath.Join(links, device+"_"+side)); err != nil {
			t.Fatal(err)
		}
	}
	if n := countReached(reached, time.Second); n > 0 {
		t.Errorf("the pins deleted: %d connections reached the isolated pod in 1 s", n)
	}
	waitPinned := func() {
		t.Helper()
		a.WaitFor("the pins back", func() bool {
			for _, side := range []string{"ingress", "egress"} {
				if _, err := os.Stat(filepath.Join(links, device+"_"+side)); err != nil {
					return false
				}
			}
			return true
		})
	}
	waitPinned()

	h, err := netlink.NewHandleAt(node.ns[node.Node])
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	dev, err := h.LinkByName(device)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "foreign_pass", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}, // TCX_PASS
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	info, _ := prog.Info()
	id, _ := info.ID()
	var foreign link.Link
	start := time.Now()
	err = celltest.InNS(node.ns[node.Node], func() (err error) {
		foreign, err = link.AttachTCX(link.TCXOptions{Interface: dev.Attrs().Index, Program: prog, Attach: ebpf.AttachTCXEgress, Anchor: link.Head()})
		return err
	})
	if err != nil {
		t.Fatalf("attach the foreign program: %s", err)
	}
	defer foreign.Close()

	// Until the check (--network-policy-attach-check-interval, 1 s) the
	// foreign program decides: count what got in meanwhile.
	named := func(out string) bool {
		return strings.Contains(out, fmt.Sprintf("program %d %q", id, "foreign_pass")) && strings.Contains(out, "on the egress")
	}
	leaked := countReachedUntil(reached)
	a.WaitFor("the row Error naming the foreign program", func() bool {
		out := a.MustDbg("shell", "--", "db/show", "policy-attachments")
		return strings.Contains(out, "Error") && named(out)
	})
	t.Logf("foreign program ahead: the row Error after %s, %d connections got in before the check",
		time.Since(start).Round(time.Millisecond), leaked())
	a.WaitFor("health Degraded naming the foreign program", func() bool {
		out, _, _ := a.Dbg("health")
		return strings.Contains(out, "Degraded") && named(out)
	})
	if n := countReached(reached, time.Second); n > 0 {
		t.Errorf("the foreign program still ahead: %d connections reached the isolated pod in 1 s", n)
	}
	foreign.Close()
	waitAttached(a, 1)

	// A bpffs mounted again (in the agent's mount namespace: ip netns exec
	// gave it one of its own) loses the pins, not the programs.
	inAgentMounts := func(args ...string) error {
		return exec.Command("nsenter", append([]string{"-t", strconv.Itoa(a.cmd.Process.Pid), "-m", "--"}, args...)...).Run()
	}
	if err := inAgentMounts("sh", "-c", "umount -l "+a.BPFRoot+" && mount -t bpf -o mode=0700 bpffs "+a.BPFRoot); err != nil {
		t.Fatalf("mount the agent's bpffs again: %s", err)
	}
	if inAgentMounts("test", "-e", filepath.Join(links, device+"_egress")) == nil {
		t.Fatal("a pin survived the remount")
	}
	if n := countReached(reached, time.Second); n > 0 {
		t.Errorf("bpffs mounted again: %d connections reached the isolated pod in 1 s", n)
	}
	a.WaitFor("the pins back in the bpffs mounted again", func() bool {
		return inAgentMounts("test", "-e", filepath.Join(links, device+"_ingress")) == nil &&
			inAgentMounts("test", "-e", filepath.Join(links, device+"_egress")) == nil
	})

}

// countReached counts the tries of reached that succeed for d.
func countReached(reached func() bool, d time.Duration) int {
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		if reached() {
			n++
		}
	}
	return n
}
