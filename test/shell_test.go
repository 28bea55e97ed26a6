package test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The production shell offers read commands only: fault injection,
// db/insert, db/delete and exec are not there, and db/show -o (a file
// written by the agent) is refused. --enable-debug-shell offers them all.
func TestPrivilegedShellIsReadOnlyWithoutDebugShell(t *testing.T) {
	faults := [][]string{
		{"policymap/fault-probability", "0"},
		{"policymap/fail-prefix", "10.0.0.0/8"},
		{"policymap/policy-fault-probability", "0"},
		{"db/insert", "ip-masq-agent-cidrs", "row.yaml"},
		{"db/delete", "ip-masq-agent-cidrs", "row.yaml"},
		{"exec", "true"},
	}
	for _, debug := range []bool{false, true} {
		a := NewAgent(t, "--enable-network-policy", "--policy-endpoints-path", t.TempDir(), "--enable-ip-masq-agent", "--enable-bpf-masquerade",
			"--ip-masq-agent-config-path", filepath.Join(t.TempDir(), "ip-masq-agent"))
		if debug {
			a.Args = append(a.Args, "--enable-debug-shell")
		}
		a.Start()
		a.WaitHealthy()

		help := a.MustDbg("shell", "--", "help")
		for _, read := range []string{"db/show", "health", "metrics", "policymap/policy-verdict", "ipam/rules"} {
			if !strings.Contains(help, read) {
				t.Errorf("debug=%t: help does not offer %s:\n%s", debug, read, help)
			}
		}
		for _, cmd := range faults {
			if debug && (cmd[0] == "db/insert" || cmd[0] == "db/delete") {
				// Offered: they fail on the missing file, not as unknown.
				out, _, _ := a.Dbg(append([]string{"shell", "--"}, cmd...)...)
				if strings.Contains(out, "unknown command") {
					t.Errorf("debug shell: %s unknown: %s", cmd[0], out)
				}
				continue
			}
			out, _, err := a.Dbg(append([]string{"shell", "--"}, cmd...)...)
			switch {
			case !debug && (err == nil || !strings.Contains(out, "unknown command")):
				t.Errorf("shell without --enable-debug-shell ran %s (%v): %s", strings.Join(cmd, " "), err, out)
			case debug && err != nil:
				t.Errorf("debug shell: %s: %v: %s", strings.Join(cmd, " "), err, out)
			}
			if !debug && strings.Contains(help, cmd[0]+" ") {
				t.Errorf("help offers %s without --enable-debug-shell", cmd[0])
			}
		}

		file := filepath.Join(t.TempDir(), "rows")
		out, _, err := a.Dbg("shell", "--", "db/show", "-o", file, "ip-masq-agent-cidrs")
		_, statErr := os.Stat(file)
		if debug {
			if err != nil || statErr != nil {
				t.Errorf("debug shell: db/show -o: %v, %v: %s", err, statErr, out)
			}
		} else {
			if err == nil || !strings.Contains(out, "refused without --enable-debug-shell") || statErr == nil {
				t.Errorf("db/show -o not refused (%v, file: %v): %s", err, statErr, out)
			}
			if rows := a.MustDbg("shell", "--", "db/show", "ip-masq-agent-cidrs"); !strings.Contains(rows, "10.0.0.0/8") {
				t.Errorf("db/show without -o:\n%s", rows)
			}
		}
		if _, err := a.Stop(); err != nil {
			t.Fatal(err)
		}
	}
}

// The fault-injection flag needs --enable-debug-shell too.
func TestPrivilegedFaultFlagNeedsDebugShell(t *testing.T) {
	a := NewAgent(t, "--bpf-map-fault-probability", "0.5")
	out, err := a.Command().CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 ||
		!strings.Contains(string(out), "--bpf-map-fault-probability is a testing flag: it needs --enable-debug-shell") {
		t.Errorf("agent with --bpf-map-fault-probability and no --enable-debug-shell: %v\n%s", err, out)
	}
}
