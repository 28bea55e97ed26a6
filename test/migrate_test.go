package test

// Migrating from the AWS network policy agent: its tc filters on a pod's
// eni* device, as v1.5.0 installs them, are found by the agent and named in
// the row and in health, never removed, while enimasq's programs enforce.

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
)

// awsFilters installs the AWS network policy agent's tc filters on the
// node's device the way v1.5.0 does (aws-ebpf-sdk-go's TCIngressAttach and
// TCEgressAttach): a clsact qdisc, then a direct-action bpf filter at
// priority 1, handle 1, protocol all, named after its program:
// handle_ingress on the device's egress (what the pod receives),
// handle_egress on its ingress. Each program returns TC_ACT_OK (allow).
// It returns the program IDs by filter name.
func awsFilters(t *testing.T, n *policyNode, device string) map[string]ebpf.ProgramID {
	t.Helper()
	ids := map[string]ebpf.ProgramID{}
	err := celltest.InNS(n.ns[n.Node], func() error {
		l, err := netlink.LinkByName(device)
		if err != nil {
			return err
		}
		qdisc := &netlink.GenericQdisc{
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
			QdiscType:  "clsact",
		}
		if err := netlink.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("clsact: %w", err)
		}
		for name, parent := range map[string]uint32{"handle_ingress": netlink.HANDLE_MIN_EGRESS, "handle_egress": netlink.HANDLE_MIN_INGRESS} {
			prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
				Name: name, Type: ebpf.SchedCLS, License: "Apache-2.0",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}, // TC_ACT_OK
			})
			if err != nil {
				return fmt.Errorf("program %s: %w", name, err)
			}
			t.Cleanup(func() { prog.Close() })
			info, _ := prog.Info()
			ids[name], _ = info.ID()
			err = netlink.FilterAdd(&netlink.BpfFilter{
				FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: parent, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1},
				Fd:          prog.FD(), Name: name, DirectAction: true,
			})
			if err != nil {
				return fmt.Errorf("filter %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the AWS agent's filters on %s: %s", device, err)
	}
	return ids
}

// tcFilters is `tc filter show dev <device> <side>` in the node.
func tcFilters(t *testing.T, n *policyNode, device, side string) string {
	t.Helper()
	return run(t, "tc", "-n", n.Node, "filter", "show", "dev", device, side)
}

func TestPrivilegedMigrationFromTheAWSAgentNamesItsFilters(t *testing.T) {
	node := newPolicyNode(t)
	const device = "eni5f2a9c1d3b7"
	node.addPod("a", device, podA)
	ids := awsFilters(t, node, device)
	before := map[string]string{}
	for _, side := range []string{"ingress", "egress"} {
		before[side] = tcFilters(t, node, device, side)
	}

	a, _ := node.startAgent(map[string]string{"a": policyEndpoint("a", podA, []string{"Ingress"}, nil, nil)})
	names := func(out string) bool {
		return strings.Contains(out, device) &&
			strings.Contains(out, fmt.Sprintf(`tc bpf filter "handle_ingress" (pref 1, handle 0x1, program %d)`, ids["handle_ingress"])) &&
			strings.Contains(out, fmt.Sprintf(`tc bpf filter "handle_egress" (pref 1, handle 0x1, program %d)`, ids["handle_egress"]))
	}
	a.WaitFor("the row Error naming the AWS agent's filters", func() bool {
		out := a.MustDbg("shell", "--", "db/show", "policy-attachments")
		return strings.Contains(out, "Error") && names(out)
	})
	a.WaitFor("health Degraded naming the device and the AWS agent's filters", func() bool {
		out, _, _ := a.Dbg("health")
		return strings.Contains(out, "Degraded") && names(out)
	})
	t.Logf("row: %s", a.MustDbg("shell", "--", "db/show", "policy-attachments"))

	// enimasq's programs are on the device and decide first: the pod's
	// ingress is isolated, the AWS agent's TC_ACT_OK lets nothing more in.
	if n := countReached(func() bool { return node.connect(node.peerNS(), podA, 80) }, time.Second); n > 0 {
		t.Errorf("with the AWS agent's filters on the device, %d connections reached the isolated pod in 1 s", n)
	}
	if !node.connect(node.podNS("a"), policyPeerIP, 80) {
		t.Error("the pod cannot reach the peer: its egress is not isolated")
	}
	// Theirs are left as they were.
	for _, side := range []string{"ingress", "egress"} {
		if now := tcFilters(t, node, device, side); now != before[side] {
			t.Errorf("the AWS agent's %s filters changed:\nbefore %s\nafter  %s", side, before[side], now)
		}
	}

	// The migration's last step: their filters deleted (as their agent's
	// TCIngressDetach/TCEgressDetach do), the row is Done, health OK.
	for _, side := range []string{"ingress", "egress"} {
		run(t, "tc", "-n", node.Node, "filter", "del", "dev", device, side, "pref", "1", "handle", "1", "bpf")
	}
	waitAttached(a, 1)
	a.WaitFor("health OK", func() bool {
		_, _, err := a.Dbg("health")
		return err == nil
	})
	if n := countReached(func() bool { return node.connect(node.peerNS(), podA, 80) }, time.Second); n > 0 {
		t.Errorf("after the AWS agent's filters went, %d connections reached the isolated pod in 1 s", n)
	}
}
