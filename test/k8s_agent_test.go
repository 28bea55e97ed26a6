package test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/enimasq/enimasq/test/k8stest"
)

// k8sPolicyAgent starts an API server holding the sample CiliumNode and a
// PolicyEndpoint, and a healthy agent with network policy that reads them.
func k8sPolicyAgent(t *testing.T) (*k8stest.Cluster, *Agent) {
	t.Helper()
	c := k8stest.Start(t)
	c.ApplyFile(t, filepath.Join("testdata", "samples", "ciliumnode.yaml"))
	c.ApplyFile(t, filepath.Join("testdata", "samples", "policyendpoint-v6-except.yaml"))

	a := NewAgent(t)
	a.HostNetwork = true // the API server listens on this netns's loopback
	a.Args = append(a.Args, "--k8s-kubeconfig-path", c.Kubeconfig,
		"--k8s-node-name", "ip-10-130-0-10.ec2.internal", "--enable-network-policy")
	a.Start()
	a.WaitHealthy()
	return c, a
}

// An agent restarted while the API server is down leaves the kernel state
// as it is (no pruning on missing input) until its sources have synced, then
// converges to what changed meanwhile.
func TestPrivilegedAgentRestartWhileAPIServerDown(t *testing.T) {
	c, a := k8sPolicyAgent(t)

	list := func() string {
		out, _, _ := a.Dbg("bpf", "--bpf-root", a.BPFRoot, "policy", "list")
		return out
	}
	a.WaitFor("policy maps from the API", func() bool { return strings.Contains(list(), "10.130.112.20/32 tcp/8080") })
	before := list()

	if _, err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	c.StopAPIServer(t)
	a.Start()
	a.WaitFor("agent API up", func() bool { code, _, err := a.Get("/healthz"); return err == nil && code != 0 })

	// Without its sources the agent must not touch the maps. There is no
	// event to wait for here: watch the kernel for a while.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got := list(); got != before {
			t.Fatalf("maps changed while the API server was down:\nbefore:\n%s\nnow:\n%s", before, got)
		}
	}
	if _, body, _ := a.Get("/healthz"); !strings.Contains(string(body), "Degraded") {
		t.Errorf("health does not report the unreachable API server:\n%s", body)
	}

	// The API server comes back: the agent syncs and converges.
	// The restarted agent may move the pod to a new version of the same
	// policy; the old version's keys go once the new one is in force.
	c.StartAPIServer(t)
	a.WaitHealthy()
	got := list()
	for deadline := time.Now().Add(10 * time.Second); got != before && time.Now().Before(deadline); got = list() {
		time.Sleep(50 * time.Millisecond)
	}
	if got != before {
		t.Errorf("maps after the API server came back:\n%s\nwant:\n%s", got, before)
	}
}
