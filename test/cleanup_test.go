package test

// enimasq-dbg cleanup (uninstalling): with the agent stopped, nothing of
// enimasq's is left in the kernel, bpffs or the state dir; nothing of
// another writer is touched; a second run changes nothing; a run while the
// agent holds the node is refused.

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/enimasq/enimasq/cells/celltest"
)

// cleanup runs enimasq-dbg cleanup in the node's netns on the agent's
// state dir and bpffs, and returns its output and exit error.
func cleanup(t *testing.T, a *Agent, node string, extra ...string) (string, error) {
	t.Helper()
	args := append([]string{"netns", "exec", node, Build(t).Dbg, "--state-dir", a.StateDir, "cleanup",
		"--bpf-root", a.BPFRoot, "--cilium-socket", filepath.Join(a.Dir, "no-cilium.sock"),
		"--cni-conf-dir=", "--cni-bin-dir="}, extra...) // not this machine's CNI files
	var out bytes.Buffer
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// enimasqState lists what of enimasq's the node holds: pins in bpffs
// under enimasq/ and tc/globals (enimasq_*, cilium_ipmasq_*), tcx
// programs and enimasq-policy tc filters on the node's links, rules and
// routes with protocol 237, the IPAM checkpoint.
func enimasqState(t *testing.T, a *Agent, topo *vpcTopology) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(a.BPFRoot, func(path string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(a.BPFRoot, path)
		if err == nil && !d.IsDir() && (strings.HasPrefix(rel, "enimasq/") || strings.HasPrefix(rel, "tc/globals/enimasq_") ||
			strings.HasPrefix(rel, "tc/globals/cilium_ipmasq_")) {
			out = append(out, "pin "+rel)
		}
		return nil
	})
	err := celltest.InNS(topo.nodeNS, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			for _, side := range []struct {
				attach ebpf.AttachType
				parent uint32
			}{{ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS}, {ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS}} {
				chain, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: side.attach})
				if err != nil {
					return err
				}
				for _, p := range chain.Programs {
					out = append(out, fmt.Sprintf("tcx program %d on %s (%s)", p.ID, l.Attrs().Name, side.attach))
				}
				filters, _ := netlink.FilterList(l, side.parent)
				for _, f := range filters {
					if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == "enimasq-policy" {
						out = append(out, fmt.Sprintf("tc filter %s on %s (parent %#x)", bf.Name, l.Attrs().Name, side.parent))
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list the node's programs: %s", err)
	}
	for _, r := range IPRules(t, topo.nodeNS) {
		out = append(out, "rule "+r)
	}
	for _, r := range strings.Split(strings.TrimSpace(run(t, "ip", "-n", topo.Node, "route", "show", "table", "all", "proto", "237")), "\n") {
		if r != "" {
			out = append(out, "route "+r)
		}
	}
	if _, err := os.Stat(filepath.Join(a.StateDir, "ipam-allocations.json")); !errors.Is(err, os.ErrNotExist) {
		out = append(out, "checkpoint")
	}
	slices.Sort(out)
	return out
}

// waitDevicesDone waits until policy-attachments has a row of pod ip and
// every row is Done.
func waitDevicesDone(a *Agent, ip string) {
	a.t.Helper()
	a.WaitFor("the pods' devices carrying the programs", func() bool {
		out := a.MustDbg("shell", "--", "db/show", "policy-attachments")
		rows := strings.Split(strings.TrimSpace(out), "\n")[1:]
		return strings.Contains(out, ip) && !slices.ContainsFunc(rows, func(r string) bool { return !strings.Contains(r, "Done") })
	})
}

func TestPrivilegedCleanupLeavesNothingOfEnimasq(t *testing.T) {
	topo := newVPCTopology(t)
	a, pes := cniPolicyAgent(t, topo)
	cni := newCNIRuntime(t, topo, a.APISocket())
	nsA, nsB := cni.newPod("client"), cni.newPod("server")
	ipA, ipB := cni.add(nsA, "client"), cni.add(nsB, "server")
	pe := policyEndpoint("server", ipB, []string{"Ingress"}, []peRule{{cidr: ipA + "/32", ports: []string{"TCP 80"}}}, nil)
	WriteFileAtomic(t, filepath.Join(pes, "server.yaml"), onCNINode(pe))
	waitDevicesDone(a, ipB)

	// Another writer's rule, route and tc filter stay.
	run(t, "ip", "-n", topo.Node, "rule", "add", "from", "10.9.9.9", "lookup", "100", "pref", "300", "proto", "static")
	run(t, "ip", "-n", topo.Node, "route", "add", "10.9.0.0/16", "dev", "eni1", "table", "100", "proto", "static")
	theirs := func() string {
		var lines []string
		for _, l := range strings.Split(run(t, "ip", "-n", topo.Node, "rule"), "\n") {
			if strings.Contains(l, "proto static") {
				lines = append(lines, l)
			}
		}
		return strings.Join(lines, "\n") + "\n" + run(t, "ip", "-n", topo.Node, "route", "show", "table", "100")
	}
	before := theirs()
	if !strings.Contains(before, "10.9.9.9") || !strings.Contains(before, "10.9.0.0/16") {
		t.Fatalf("another writer's rule and route are not there:\n%s", before)
	}

	// While the agent runs: refused, and nothing removed.
	held := enimasqState(t, a, topo)
	out, err := cleanup(t, a, topo.Node)
	if err == nil || !strings.Contains(out, "refused") || !strings.Contains(out, "agent.lock") {
		t.Fatalf("cleanup while the agent runs: %v, want refused naming the lock:\n%s", err, out)
	}
	if now := enimasqState(t, a, topo); !slices.Equal(now, held) {
		t.Fatalf("a refused cleanup changed the node:\nbefore %q\nafter  %q", held, now)
	}

	// A run with the tc fallback adds enimasq's tc filters to its tcx links.
	if _, err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	a.Args = append(a.Args, "--network-policy-attach=tc")
	a.Start()
	a.WaitHealthy()
	waitDevicesDone(a, ipB)
	if _, err := a.Stop(); err != nil {
		t.Fatal(err)
	}

	left := enimasqState(t, a, topo)
	for _, want := range []string{"pin enimasq/links/", "pin tc/globals/enimasq_policy_ct", "pin tc/globals/cilium_ipmasq_v4",
		"tcx program", "tc filter enimasq-policy", "rule 111:", "route ", "checkpoint"} {
		if !slices.ContainsFunc(left, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("the stopped agent left no %q: the test proves nothing of it (%q)", want, left)
		}
	}

	out, err = cleanup(t, a, topo.Node)
	if err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	t.Logf("cleanup:\n%s", out)
	now := enimasqState(t, a, topo)
	if strings.Contains(out, "Cilium runs") {
		// Another test's cilium-agent: the maps are kept, and said so.
		now = slices.DeleteFunc(now, func(s string) bool { return strings.HasPrefix(s, "pin tc/globals/cilium_ipmasq_") })
	} else if !strings.Contains(out, "removed the cilium_ipmasq_v4/v6 pins: no Cilium runs") {
		t.Errorf("cleanup does not say what it chose for cilium_ipmasq_*:\n%s", out)
	}
	if len(now) != 0 {
		t.Errorf("after cleanup the node still holds: %q", now)
	}
	if _, err := os.Stat(filepath.Join(a.BPFRoot, "enimasq")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s/enimasq is still there (%v)", a.BPFRoot, err)
	}
	for _, want := range []string{"removed link ", "removed tc filter enimasq-policy", "removed pin " + a.BPFRoot + "/tc/globals/enimasq_",
		"removed ip rule 111:", "removed ip route ", "removed IPAM checkpoint"} {
		if !strings.Contains(out, want) {
			t.Errorf("the cleanup's report lacks %q", want)
		}
	}
	if after := theirs(); after != before {
		t.Errorf("cleanup touched another writer's rules or routes:\nbefore %s\nafter  %s", before, after)
	}

	// Again: it succeeds, says there is nothing, and changes nothing.
	snapshot := func() string {
		return run(t, "ip", "-n", topo.Node, "rule") + run(t, "ip", "-n", topo.Node, "route", "show", "table", "all") +
			strings.Join(enimasqState(t, a, topo), "\n")
	}
	was := snapshot()
	out, err = cleanup(t, a, topo.Node)
	if err != nil || !strings.Contains(out, "nothing of enimasq's is left on this node") {
		t.Errorf("second cleanup: %v\n%s", err, out)
	}
	if is := snapshot(); is != was {
		t.Errorf("the second cleanup changed the node:\nbefore %s\nafter  %s", was, is)
	}
}
