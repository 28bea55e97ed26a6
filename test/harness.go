// Package test runs the real enimasq binaries: each agent runs in a fresh
// network namespace, with a private bpffs mount and a temporary state dir, and
// is inspected through enimasq-dbg, the way an operator would.
package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/agentapi"
	"github.com/enimasq/enimasq/cells/celltest"
)

// Binaries are the enimasq executables under test, and cnitool (from the
// containernetworking/cni module) to drive the CNI plugin as a runtime does.
type Binaries struct {
	Agent   string
	Dbg     string
	CNI     string // enimasq-cni
	CNITool string
}

var (
	buildOnce sync.Once
	built     Binaries
	buildErr  error
)

// Build compiles the binaries once per test process, or uses $ENIMASQ_BIN
// (a directory holding them, as `make build` leaves in bin/).
func Build(t testing.TB) Binaries {
	t.Helper()
	buildOnce.Do(func() {
		dir := os.Getenv("ENIMASQ_BIN")
		if dir == "" {
			dir, buildErr = os.MkdirTemp("", "enimasq-bin-")
			if buildErr != nil {
				return
			}
			out, err := exec.Command("go", "build", "-race", "-o", dir+"/",
				"github.com/enimasq/enimasq/cmd/...", "github.com/containernetworking/cni/cnitool").CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("go build: %w\n%s", err, out)
				return
			}
		}
		built = Binaries{
			Agent:   filepath.Join(dir, "enimasq-agent"),
			Dbg:     filepath.Join(dir, "enimasq-dbg"),
			CNI:     filepath.Join(dir, "enimasq-cni"),
			CNITool: filepath.Join(dir, "cnitool"),
		}
		if _, err := os.Stat(built.CNITool); err != nil {
			toolDir, err := os.MkdirTemp("", "enimasq-cnitool-")
			if err != nil {
				buildErr = err
				return
			}
			built.CNITool = filepath.Join(toolDir, "cnitool")
			out, err := exec.Command("go", "build", "-o", built.CNITool, "github.com/containernetworking/cni/cnitool").CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("go build cnitool: %w\n%s", err, out)
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// Agent is one running enimasq-agent.
type Agent struct {
	t        testing.TB
	bin      Binaries
	Dir      string // scratch dir of the test
	StateDir string
	BPFRoot  string
	Args     []string
	// NetNSName, when set, is the named network namespace (ip netns) the agent
	// runs in; otherwise it gets a fresh anonymous one.
	NetNSName string
	// Wrap, when set, is the command the agent runs under (setpriv
	// dropping capabilities, say), its arguments first.
	Wrap []string
	// HostNetwork runs the agent in the test's own network namespace (to
	// reach an API server on the test's loopback).
	HostNetwork bool

	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan struct{}
	err    error
}

// NewAgent prepares an agent: a state dir and a private bpffs mount. Start
// runs it.
func NewAgent(t testing.TB, args ...string) *Agent {
	t.Helper()
	celltest.RequireRoot(t)
	dir := t.TempDir()
	a := &Agent{
		t:        t,
		bin:      Build(t),
		Dir:      dir,
		StateDir: filepath.Join(dir, "state"),
		BPFRoot:  filepath.Join(dir, "bpf"),
		Args:     args,
	}
	if err := os.Mkdir(a.BPFRoot, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpffs", a.BPFRoot, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %s", err)
	}
	t.Cleanup(func() { unix.Unmount(a.BPFRoot, unix.MNT_DETACH) })
	return a
}

// StartAgent starts an agent and waits until its API answers /healthz.
func StartAgent(t testing.TB, args ...string) *Agent {
	t.Helper()
	a := NewAgent(t, args...)
	a.Start()
	a.WaitHealthy()
	return a
}

// Command is the agent's command line, in its own network namespace.
func (a *Agent) Command(extra ...string) *exec.Cmd {
	args := append([]string{"--state-dir", a.StateDir, "--bpf-root", a.BPFRoot}, a.Args...)
	args = append(args, extra...)
	argv := append(append(slices.Clone(a.Wrap), a.bin.Agent), args...)
	if a.NetNSName != "" {
		// ip netns exec execs the agent: the PID stays the agent's.
		cmd := exec.Command("ip", append([]string{"netns", "exec", a.NetNSName}, argv...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return cmd
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if !a.HostNetwork {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	}
	return cmd
}

// Start runs the agent in the background; it is killed at test cleanup.
func (a *Agent) Start() {
	a.t.Helper()
	a.cmd = a.Command()
	a.stderr = &syncBuffer{}
	a.cmd.Stderr = a.stderr
	a.cmd.Stdout = a.stderr
	if err := a.cmd.Start(); err != nil {
		a.t.Fatalf("start agent: %s", err)
	}
	a.exited = make(chan struct{})
	go func() {
		a.err = a.cmd.Wait()
		close(a.exited)
	}()
	a.t.Cleanup(func() {
		a.cmd.Process.Kill()
		<-a.exited
		if a.t.Failed() {
			a.t.Logf("agent log:\n%s", a.stderr.String())
		}
	})
}

// Log is what the agent printed so far.
func (a *Agent) Log() string { return a.stderr.String() }

// APISocket and ShellSocket are the agent's default socket paths.
func (a *Agent) APISocket() string   { return filepath.Join(a.StateDir, "enimasq.sock") }
func (a *Agent) ShellSocket() string { return filepath.Join(a.StateDir, "shell.sock") }

// Get fetches a path from the agent API.
func (a *Agent) Get(path string) (int, []byte, error) {
	return agentapi.NewClient(a.APISocket(), 5*time.Second).Get(path)
}

// WaitHealthy waits until /healthz answers 200. The agent is another process:
// there is no channel to wait on, so this polls, bounded by a deadline.
func (a *Agent) WaitHealthy() {
	a.t.Helper()
	a.WaitFor("/healthz answering 200", func() bool {
		code, _, err := a.Get("/healthz")
		return err == nil && code == http.StatusOK
	})
}

// WaitStarted waits until the agent's hive has run every start hook
// ("Started hive"): what they write to the kernel is there from then on.
func (a *Agent) WaitStarted() {
	a.t.Helper()
	a.WaitFor("the hive started", func() bool { return strings.Contains(a.Log(), `msg="Started hive"`) })
}

// WaitFor polls cond every 20 ms for up to 30 s, failing the test if the
// agent exits or the deadline passes.
func (a *Agent) WaitFor(what string, cond func() bool) {
	a.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		select {
		case <-a.exited:
			a.t.Fatalf("agent exited (%v) while waiting for %s; log:\n%s", a.err, what, a.Log())
		default:
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop sends SIGTERM and returns how long the agent took to exit.
func (a *Agent) Stop() (time.Duration, error) {
	start := time.Now()
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
		return time.Since(start), a.err
	case <-time.After(10 * time.Second):
		return time.Since(start), errors.New("agent did not exit within 10s of SIGTERM")
	}
}

// Dbg runs enimasq-dbg against this agent and returns stdout, stderr and the
// exit error.
func (a *Agent) Dbg(args ...string) (string, string, error) {
	return RunDbg(a.t, a.StateDir, args...)
}

// RunDbg runs enimasq-dbg with --state-dir.
func RunDbg(t testing.TB, stateDir string, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(Build(t).Dbg, append([]string{"--state-dir", stateDir}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// MustDbg is Dbg that fails the test on a non-zero exit.
func (a *Agent) MustDbg(args ...string) string {
	a.t.Helper()
	out, errOut, err := a.Dbg(args...)
	if err != nil {
		a.t.Fatalf("enimasq-dbg %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Rows returns a table's rows as enimasq-dbg statedb dump prints them.
func (a *Agent) Rows(table string) []map[string]any {
	a.t.Helper()
	var dump map[string][]map[string]any
	out := a.MustDbg("statedb", "dump", table)
	if err := json.Unmarshal([]byte(out), &dump); err != nil {
		a.t.Fatalf("statedb dump %s: %s\n%s", table, err, out)
	}
	return dump[table]
}

// Column is one field of every row, in table order.
func Column(rows []map[string]any, field string) []string {
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		out = append(out, fmt.Sprint(r[field]))
	}
	return out
}

// WriteFileAtomic replaces path the way a careful writer does: a temporary
// file renamed over it.
var WriteFileAtomic = celltest.WriteFileAtomic
