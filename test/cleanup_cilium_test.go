package test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/cells/celltest"
)

// In the Cilium build, Cilium's agent runs enimasq's cells and takes no
// enimasq lock: cleanup refuses while a cilium-agent that links them runs
// (as its build info says), and works once it is gone.
func TestPrivilegedCleanupRefusesWhileTheCiliumBuildRuns(t *testing.T) {
	bin := Build(t)
	cleanup := cleanupInNewNetNS(t)
	// A process named cilium-agent whose binary links enimasq: a copy of
	// enimasq-dbg, waiting on its stdin.
	fake := filepath.Join(t.TempDir(), "cilium-agent")
	data, err := os.ReadFile(bin.Dbg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fake, data, 0o755); err != nil {
		t.Fatal(err)
	}
	agent := exec.Command(fake, "policy", "verdict", "--stdin", "--bpf-root", t.TempDir())
	stdin, err := agent.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	agent.Stdout, agent.Stderr = io.Discard, io.Discard
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); agent.Process.Kill(); agent.Wait() })

	out, err := cleanup()
	if err == nil || !strings.Contains(out, "links enimasq's cells") {
		t.Fatalf("cleanup while a Cilium build runs: %v, want refused naming it:\n%s", err, out)
	}
	stdin.Close()
	agent.Wait()
	if out, err := cleanup(); err != nil {
		t.Fatalf("cleanup once the Cilium build stopped: %v\n%s", err, out)
	}
}

// cleanup removes the conflist and the plugin the DaemonSet installed,
// and nothing else of their directories.
func TestPrivilegedCleanupRemovesTheCNIFiles(t *testing.T) {
	cleanup := cleanupInNewNetNS(t)
	conf, plugins := t.TempDir(), t.TempDir()
	for _, f := range []string{filepath.Join(conf, "10-enimasq.conflist"), filepath.Join(conf, "05-other.conflist"),
		filepath.Join(plugins, "enimasq-cni"), filepath.Join(plugins, "loopback")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // idempotent
		if out, err := cleanup("--cni-conf-dir", conf, "--cni-bin-dir", plugins); err != nil {
			t.Fatalf("cleanup: %v\n%s", err, out)
		}
	}
	for f, want := range map[string]bool{filepath.Join(conf, "10-enimasq.conflist"): false, filepath.Join(conf, "05-other.conflist"): true,
		filepath.Join(plugins, "enimasq-cni"): false, filepath.Join(plugins, "loopback"): true} {
		if _, err := os.Stat(f); (err == nil) != want {
			t.Errorf("%s: present=%t after cleanup, want %t", f, err == nil, want)
		}
	}
}

// cleanupInNewNetNS returns a run of enimasq-dbg cleanup, with the extra
// flags, on a state dir and a bpffs of its own, in a network namespace of
// its own.
func cleanupInNewNetNS(t *testing.T) func(extra ...string) (string, error) {
	t.Helper()
	celltest.RequireRoot(t)
	bin := Build(t)
	bpfRoot, stateDir := celltest.MountBPFFS(t), t.TempDir()
	suffix := make([]byte, 3)
	rand.Read(suffix)
	ns := "enq-clean-" + hex.EncodeToString(suffix)
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	return func(extra ...string) (string, error) {
		var out bytes.Buffer
		args := append([]string{"netns", "exec", ns, bin.Dbg, "--state-dir", stateDir, "cleanup", "--bpf-root", bpfRoot,
			"--cilium-socket", filepath.Join(stateDir, "no-cilium.sock"), "--cni-conf-dir=", "--cni-bin-dir="}, extra...)
		cmd := exec.Command("ip", args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
}
