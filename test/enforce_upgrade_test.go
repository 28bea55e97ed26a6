package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// releaseBeforeVersions is the commit of the release before per-pod policy
// versions: its policy maps have keys without a version, and it has no
// versions map.
const releaseBeforeVersions = "672e45b"

var (
	oldAgentOnce sync.Once
	oldAgentPath string
	oldAgentErr  error
)

// oldAgent is enimasq-agent built from releaseBeforeVersions (git archive
// of this clone, go build), cached in ~/.cache/enimasq; the test is
// skipped, saying why, when the clone does not hold that commit.
func oldAgent(t *testing.T) string {
	t.Helper()
	if err := exec.Command("git", "cat-file", "-e", releaseBeforeVersions+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s (the release before versions) is not in this clone: %v", releaseBeforeVersions, err)
	}
	oldAgentOnce.Do(func() {
		home, err := os.UserHomeDir()
		if err != nil {
			oldAgentErr = err
			return
		}
		cache := filepath.Join(home, ".cache", "enimasq")
		oldAgentPath = filepath.Join(cache, "enimasq-agent-"+releaseBeforeVersions)
		if _, err := os.Stat(oldAgentPath); err == nil {
			return
		}
		src, err := os.MkdirTemp("", "enimasq-"+releaseBeforeVersions+"-")
		if err != nil {
			oldAgentErr = err
			return
		}
		defer os.RemoveAll(src)
		// From the top of the clone: in a subdirectory, git archive
		// archives only that.
		archive := exec.Command("sh", "-c", fmt.Sprintf("cd \"$(git rev-parse --show-toplevel)\" && git archive %s | tar -x -C %s", releaseBeforeVersions, src))
		if out, err := archive.CombinedOutput(); err != nil {
			oldAgentErr = fmt.Errorf("git archive %s: %w\n%s", releaseBeforeVersions, err, out)
			return
		}
		if err := os.MkdirAll(cache, 0o755); err != nil {
			oldAgentErr = err
			return
		}
		tmp := oldAgentPath + ".tmp"
		build := exec.Command("go", "build", "-o", tmp, "./cmd/enimasq-agent")
		build.Dir = src
		if out, err := build.CombinedOutput(); err != nil {
			oldAgentErr = fmt.Errorf("go build the agent of %s: %w\n%s", releaseBeforeVersions, err, out)
			return
		}
		oldAgentErr = os.Rename(tmp, oldAgentPath)
	})
	if oldAgentErr != nil {
		t.Fatal(oldAgentErr)
	}
	return oldAgentPath
}

// Upgrading a running node from the release before versions lets no
// packet through: that release's agent enforces a deny-all ingress
// NetworkPolicy and an Admin tier (deny TCP 80 in, accept TCP 443 out over
// the pod's egress isolation); under probe loops it stops and this build
// starts on the same bpffs. The policy maps of that release (keys without
// a version) are migrated before anything is opened (compile/migrate.go):
// no denied flow passes and no accepted one fails, and the pod's policy is
// taken over at the migrated version (nothing written anew).
func TestPrivilegedPolicyUpgradeFromBeforeVersions(t *testing.T) {
	old := oldAgent(t)
	n := newClusterNode(t, map[string]string{"a": podA})
	files := map[string]string{
		"a": policyEndpoint("a", podA, []string{"Ingress", "Egress"}, nil, nil),
		"cpe": clusterPolicyEndpoint("keep", "Admin", 10, []string{podA},
			[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}, action: "Deny"}},
			[]cpeRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 443"}, action: "Accept"}}),
	}
	a := NewAgent(t)
	current := a.bin
	a.bin.Agent = old
	a.NetNSName = n.Node
	n.dir = filepath.Join(a.Dir, "policyendpoints")
	for name, content := range files {
		WriteFileAtomic(t, filepath.Join(n.dir, name+".yaml"), content)
	}
	a.Args = append(a.Args, "--enable-network-policy", "--policy-endpoints-path", n.dir, "--enable-ipv6=false")
	a.Start()
	a.WaitHealthy()
	n.agent = a
	deniedAdmin := cprobe{"a", "ingress", "tcp", policyPeerIP, 80, false, "admin ClusterPolicyEndpoint/keep"}
	deniedNP := cprobe{"a", "ingress", "tcp", policyPeerIP, 8080, false, "namespace PolicyEndpoint/e2e/a"}
	allowed := cprobe{"a", "egress", "tcp", policyPeerIP, 443, true, "admin ClusterPolicyEndpoint/keep"}
	probes := []cprobe{deniedAdmin, deniedNP, allowed}
	// The old agent's enforcement, judged by traffic alone (its tools are
	// not this build's).
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok := true
		for _, p := range probes {
			ok = ok && n.try(p) == p.allow
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent of %s does not enforce the policy:\n%s", releaseBeforeVersions, a.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}

	stop := n.probeLoops(deniedAdmin, deniedAdmin, deniedNP, deniedNP, allowed, allowed)
	time.Sleep(300 * time.Millisecond)
	ns := a.NetNS()
	if _, err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	a.bin = current
	a.StartInNetNS(ns)
	a.WaitHealthy()
	waitAttached(a, 1)
	for _, table := range []string{"policy-map-entries", "cluster-policy-map-entries"} {
		a.WaitFor(table+" Done", func() bool {
			rows := a.Rows(table)
			return len(rows) > 0 && !strings.Contains(fmt.Sprint(rows), "Pending")
		})
	}
	time.Sleep(300 * time.Millisecond)
	c := stop()
	t.Logf("%d probes through the upgrade", c.tries)
	if c.leaked > 0 {
		t.Errorf("%d connections the policy denies passed through the upgrade", c.leaked)
	}
	if c.failed > 0 {
		t.Errorf("%d connections the Admin tier accepts failed through the upgrade", c.failed)
	}
	if !strings.Contains(a.Log(), "Migrated the policy maps of the release before versions") {
		t.Errorf("the agent does not log the migration")
	}
	for _, r := range a.Rows("policy-versions") {
		if got := fmt.Sprint(r["NetworkPolicy"], r["Cluster"]); got != "map[Active:1 Failed: Prev:0 Rows:4 Want:1] map[Active:1 Failed: Prev:0 Rows:6 Want:1]" {
			t.Errorf("pod %v at versions %s, want both tiers at the migrated version 1, taken over", r["Pod"], got)
		}
	}
	n.expect(t, probes...)
}
