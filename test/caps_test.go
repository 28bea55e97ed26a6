package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The DaemonSet's agent is not privileged: it runs with NET_ADMIN,
// SYS_ADMIN, BPF, PERFMON and NET_RAW only (Documentation/deploy/standalone/
// daemonset.yaml). With exactly those, the agent starts healthy (its DNS
// proxy too), pins its maps and enforces a policy on a pod's device.
func TestPrivilegedAgentWithTheDaemonSetsCapabilities(t *testing.T) {
	const caps = "net_admin,sys_admin,bpf,perfmon,net_raw"
	node, a := agentWithCaps(t, caps, "enimcapcap01")
	a.WaitHealthy()

	// The agent's effective set is the DaemonSet's, no more.
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var eff uint64
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			eff, _ = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	const want = 1<<12 | 1<<13 | 1<<21 | 1<<38 | 1<<39 // NET_ADMIN, NET_RAW, SYS_ADMIN, PERFMON, BPF
	if eff != want {
		t.Fatalf("the agent's CapEff is %#x, want %#x (%s)", eff, uint64(want), caps)
	}

	waitAttached(a, 1)
	if node.connect(node.peerNS(), podA, 80) {
		t.Error("the peer reached the pod: its ingress is isolated")
	}
	if !node.connect(node.podNS("a"), policyPeerIP, 80) {
		t.Error("the pod did not reach the peer (its egress is not isolated; the reply is tracked)")
	}
	if out := a.MustDbg("health"); strings.Contains(out, "Degraded") || strings.Contains(out, "DEGRADED") {
		t.Errorf("health with the DaemonSet's capabilities:\n%s", out)
	}
}

// Without NET_RAW the DNS proxy cannot answer the pods: the agent runs on,
// enforcing the rest, and says why domain names are not enforced.
func TestPrivilegedAgentWithoutNetRaw(t *testing.T) {
	node, a := agentWithCaps(t, "net_admin,sys_admin,bpf,perfmon", "enimcapraw01")
	a.WaitStarted()
	a.WaitFor("health to say why domain names are not enforced", func() bool {
		out, _, _ := a.Dbg("status", "--verbose")
		return strings.Contains(out, "domain names are not enforced") && strings.Contains(out, "operation not permitted")
	})
	waitAttached(a, 1)
	if node.connect(node.peerNS(), podA, 80) {
		t.Error("the peer reached the pod: its ingress is isolated")
	}
}

// agentWithCaps starts an agent with only the capabilities caps ("a,b"),
// on a policy node with pod a (on device) isolated in ingress.
func agentWithCaps(t *testing.T, caps, device string) (*policyNode, *Agent) {
	t.Helper()
	node := newPolicyNode(t)
	node.addPod("a", device, podA)
	a := NewAgent(t)
	a.NetNSName = node.Node
	a.Wrap = []string{"setpriv", "--bounding-set=-all,+" + strings.ReplaceAll(caps, ",", ",+"), "--inh-caps=-all", "--"}
	dir := filepath.Join(a.Dir, "policyendpoints")
	WriteFileAtomic(t, filepath.Join(dir, "a.yaml"), policyEndpoint("a", podA, []string{"Ingress"}, nil, nil))
	a.Args = append(a.Args, "--enable-network-policy", "--policy-endpoints-path", dir, "--enable-ipv6=false")
	a.Start()
	return node, a
}
