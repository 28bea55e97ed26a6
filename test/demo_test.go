package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/enimasq/enimasq/cells/celltest"
)

// demoCommand runs test/demo.sh with the binaries under test, its temp files
// in tmp, in its own process group (as a terminal would run it).
func demoCommand(t *testing.T, tmp string) *exec.Cmd {
	bin := Build(t)
	cmd := exec.Command("./demo.sh")
	cmd.Env = append(os.Environ(), "ENIMASQ_BIN="+filepath.Dir(bin.Agent), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// assertNothingLeft checks that a demo left no temp dir, mount or process.
func assertNothingLeft(t *testing.T, tmp string) {
	t.Helper()
	if entries, _ := os.ReadDir(tmp); len(entries) > 0 {
		t.Errorf("demo left %d entries in its temp dir: %v", len(entries), entries[0].Name())
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), tmp) {
		t.Errorf("demo left a mount under %s", tmp)
	}
	if out, _ := exec.Command("pgrep", "-f", tmp).Output(); len(out) > 0 {
		t.Errorf("demo left processes: %s", out)
	}
}

func TestPrivilegedDemoRunsAndCleansUp(t *testing.T) {
	celltest.RequireRoot(t)
	tmp := t.TempDir()
	out, err := demoCommand(t, tmp).CombinedOutput()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	for _, want := range []string{"100.200.0.0/16", "cilium_ipmasq_v4", "NO_SNAT", "Degraded", "agent stopped"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	assertNothingLeft(t, tmp)
}

func TestPrivilegedDemoCleansUpOnCtrlC(t *testing.T) {
	celltest.RequireRoot(t)
	tmp := t.TempDir()
	cmd := demoCommand(t, tmp)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Interrupt once the agent is up, as Ctrl-C does: SIGINT to the group.
	deadline := time.Now().Add(30 * time.Second)
	for {
		socks, _ := filepath.Glob(filepath.Join(tmp, "enimasq-demo.*", "state", "enimasq.sock"))
		if len(socks) > 0 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("demo agent never came up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatal("demo did not stop within 15s of SIGINT")
	}
	assertNothingLeft(t, tmp)
}
