package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/enimasq/enimasq/cells/celltest"
)

func TestPrivilegedAgentServesTablesHealthAndShell(t *testing.T) {
	a := StartAgent(t)

	var dump map[string][]json.RawMessage
	out := a.MustDbg("statedb", "dump")
	if err := json.Unmarshal([]byte(out), &dump); err != nil {
		t.Fatalf("statedb dump is not JSON: %s\n%s", err, out)
	}
	for _, table := range agentTables {
		if _, ok := dump[table]; !ok {
			t.Errorf("statedb dump has no table %q: %s", table, out)
		}
	}

	db := a.MustDbg("shell", "--", "db")
	for _, table := range agentTables {
		if !strings.Contains(db, table) {
			t.Errorf("shell -- db does not list %q:\n%s", table, db)
		}
	}

	health := a.MustDbg("health")
	for _, module := range agentModules {
		if !strings.Contains(health, module) {
			t.Errorf("health does not show module %q:\n%s", module, health)
		}
	}

	code, vars, err := a.Get("/debug/vars")
	if err != nil || code != 200 || !json.Valid(vars) || !strings.Contains(string(vars), `"reconciler"`) {
		t.Errorf("/debug/vars: %d %v %s", code, err, vars)
	}

	for _, sock := range []string{a.APISocket(), a.ShellSocket()} {
		fi, err := os.Stat(sock)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %s, want a socket with 0600", sock, fi.Mode())
		}
	}
	if fi, err := os.Stat(a.StateDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state dir: %v %v, want 0700", fi.Mode(), err)
	}
}

func TestPrivilegedSigtermStopsAgentAndRemovesSockets(t *testing.T) {
	a := StartAgent(t)
	took, err := a.Stop()
	if err != nil {
		t.Fatalf("agent exit: %v\n%s", err, a.Log())
	}
	if took > 5*time.Second {
		t.Errorf("agent took %s to stop, want < 5s", took)
	}
	for _, sock := range []string{a.APISocket(), a.ShellSocket()} {
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("%s still exists after stop (%v)", sock, err)
		}
	}
}

func TestPrivilegedSecondAgentSaysAlreadyRunning(t *testing.T) {
	a := StartAgent(t)
	before, _ := os.Stat(a.APISocket())

	second := a.Command()
	out, err := second.CombinedOutput()
	if err == nil {
		t.Fatalf("second agent exited 0:\n%s", out)
	}
	if last := lastLine(out); !strings.Contains(last, "already running") {
		t.Errorf("second agent's last line %q does not say already running", last)
	}

	after, err := os.Stat(a.APISocket())
	if err != nil || !os.SameFile(before, after) {
		t.Errorf("first agent's socket was replaced or removed: %v", err)
	}
	if _, _, err := a.Dbg("health"); err != nil {
		t.Errorf("first agent no longer answers: %v", err)
	}
}

func TestPrivilegedStaleSocketIsReplaced(t *testing.T) {
	a := NewAgent(t)
	if err := os.MkdirAll(a.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A socket file left by a killed agent: bound, then closed without unlink.
	for _, path := range []string{a.APISocket(), a.ShellSocket()} {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		l.Close()
	}
	a.Start()
	a.WaitHealthy()
	a.MustDbg("shell", "--", "db")
}

func TestPrivilegedUnmountableBPFRootExitsWithReason(t *testing.T) {
	a := NewAgent(t)
	file := filepath.Join(a.Dir, "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := a.Command("--bpf-root", filepath.Join(file, "bpf")).CombinedOutput()
	if err == nil {
		t.Fatalf("agent exited 0 with an unmountable bpf root:\n%s", out)
	}
	if last := lastLine(out); !strings.Contains(last, "--bpf-root") || !strings.Contains(last, "not-a-dir") {
		t.Errorf("last line %q does not name the bpf root", last)
	}
}

func TestAgentRejectsBadFlagsInOneLine(t *testing.T) {
	bin := Build(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--no-such-flag"}, "unknown flag: --no-such-flag"},
		{[]string{"--enable-ipv4=maybe"}, "--enable-ipv4"},
		{[]string{"--enable-ipv4=false", "--enable-ipv6=false"}, "enable at least one family"},
		{[]string{"--state-dir", "relative/dir"}, "--state-dir"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"extra-arg"}, "unknown command"},
		{[]string{"--enable-ip-masq-agent"}, "--enable-ip-masq-agent needs --enable-bpf-masquerade"},
		{[]string{"--enable-ip-masq-agent", "--enable-bpf-masquerade", "--enable-ipv4-masquerade=false", "--enable-ipv6-masquerade=false"},
			"needs --enable-ipv4-masquerade or --enable-ipv6-masquerade"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			// Hermetic even if a case were accepted: its own state dir, a
			// bpf root that cannot be mounted, and a deadline.
			args := tc.args
			if !slices.Contains(args, "--state-dir") {
				args = append(args, "--state-dir", t.TempDir())
			}
			args = append(args, "--bpf-root", filepath.Join(os.DevNull, "bpf"))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin.Agent, args...).CombinedOutput()
			if err == nil {
				t.Fatalf("exit 0:\n%s", out)
			}
			last := lastLine(out)
			if !strings.HasPrefix(last, "enimasq-agent: ") || !strings.Contains(last, tc.want) {
				t.Errorf("last line %q, want enimasq-agent: ...%s...", last, tc.want)
			}
		})
	}
}

func TestAgentHelpListsFlagsAndVersion(t *testing.T) {
	bin := Build(t)
	out, err := exec.Command(bin.Agent, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v\n%s", err, out)
	}
	for _, flag := range []string{"--enable-ipv4", "--enable-ipv6", "--bpf-root", "--state-dir", "--api-sock-path", "--shell-sock-path"} {
		if !strings.Contains(string(out), flag) {
			t.Errorf("--help does not list %s", flag)
		}
	}
	out, err = exec.Command(bin.Agent, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "version") {
		t.Errorf("--version: %v %s", err, out)
	}
}

func TestDbgSaysAgentNotRunning(t *testing.T) {
	stateDir := t.TempDir()
	for _, args := range [][]string{{"health"}, {"statedb", "dump"}, {"shell", "--", "db"}} {
		start := time.Now()
		out, errOut, err := RunDbg(t, stateDir, args...)
		// 2: the agent cannot be reached (1 is a degraded agent).
		if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 2 {
			t.Errorf("%v: exit %v, want 2", args, err)
		}
		if lines := strings.Split(strings.TrimSpace(out+errOut), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "enimasq-agent is not running") {
			t.Errorf("%v: want one line saying agent not running, got %q", args, out+errOut)
		}
		if time.Since(start) > 5*time.Second {
			t.Errorf("%v took %s", args, time.Since(start))
		}
	}
}

func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// TestPrivilegedSecondAgentInTheSameNetNSSaysAlreadyRunning: two agents in
// one network namespace would hand out the same IPs, whatever their state
// dirs: the second exits with "already running" and the first goes on.
func TestPrivilegedSecondAgentInTheSameNetNSSaysAlreadyRunning(t *testing.T) {
	celltest.RequireRoot(t)
	ns := fmt.Sprintf("enimasq-lock-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	first := NewAgent(t)
	first.NetNSName = ns
	first.Start()
	first.WaitHealthy()

	second := NewAgent(t)
	second.NetNSName = ns
	if second.StateDir == first.StateDir {
		t.Fatal("the agents share a state dir")
	}
	cmd := second.Command()
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err == nil {
			t.Fatalf("second agent exited 0:\n%s", output.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("second agent still running after 10s beside the first:\n%s", output.String())
	}
	out := output.Bytes()
	if last := lastLine(out); !strings.Contains(last, "already running in this network namespace") {
		t.Errorf("second agent's last line %q does not say already running in this network namespace", last)
	}
	if _, _, err := first.Dbg("health"); err != nil {
		t.Errorf("first agent no longer answers: %v", err)
	}
}

// A client that sends its request slowly, or keeps a connection idle, is
// disconnected after --api-read-timeout and --api-idle-timeout: a hundred of
// them do not hold the API, which still answers.
func TestPrivilegedAPITimesOutSlowAndIdleClients(t *testing.T) {
	a := StartAgent(t, "--api-read-timeout=500ms", "--api-idle-timeout=1s")
	slow := func(request string) net.Conn {
		t.Helper()
		c, err := net.Dial("unix", a.APISocket())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, request); err != nil {
			t.Fatal(err)
		}
		return c
	}
	var conns []net.Conn
	for range 100 {
		// A body announced as 100 bytes, 10 sent.
		conns = append(conns, slow("POST /v1/ipam HTTP/1.1\r\nHost: enimasq\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"owner\":"))
	}
	// A finished request on a kept-alive connection, then silence.
	idle := slow("GET /healthz HTTP/1.1\r\nHost: enimasq\r\n\r\n")
	start := time.Now()
	for i, c := range append(conns, idle) {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		// The server answers or not, then closes: read until EOF.
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("connection %d: not closed by the agent within 10s: %v", i, err)
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("slow and idle connections closed after %s, want about the timeouts (0.5s, 1s)", took)
	}
	if _, errOut, err := a.Dbg("status"); err != nil {
		t.Errorf("enimasq-dbg status after the slow clients: %v\n%s", err, errOut)
	}
}
