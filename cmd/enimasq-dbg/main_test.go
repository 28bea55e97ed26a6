package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/cells/agentapi"
)

func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errors.New("bad flag"), 1},
		{errDegraded, 1},
		{silentExit{1}, 1},
		{fmt.Errorf("health: %w", agentapi.NotRunning("/run/x.sock", errors.New("connect: no such file"))), 2},
	} {
		if got := exitCodeOf(tc.err); got != tc.want {
			t.Errorf("exitCodeOf(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestUnknownSubcommandsFail(t *testing.T) {
	for _, args := range [][]string{{"statedb", "query"}, {"bpf", "nosuch"}, {"bpf", "policy", "nosuch"}, {"nosuch"}} {
		root := newRootCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(args)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), `unknown command "`+args[len(args)-1]+`"`) {
			t.Errorf("%v: %v, want an unknown command error", args, err)
		}
	}
	// A group without a subcommand prints its help.
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"bpf"})
	if err := root.Execute(); err != nil || !strings.Contains(out.String(), "Available Commands") {
		t.Errorf("bpf: %v\n%s", err, out.String())
	}
}

func TestQueryLines(t *testing.T) {
	for line, want := range map[string]string{
		"--pod 10.0.0.5 --peer 10.1.2.3 --proto udp --port 53":         "egress 10.0.0.5 10.1.2.3 udp/53",
		"--pod 10.0.0.5 --peer 10.1.2.3 --direction ingress --port 80": "ingress 10.0.0.5 10.1.2.3 tcp/80",
		"egress 10.0.0.5 10.1.2.3 icmp":                                "egress 10.0.0.5 10.1.2.3 icmp",
	} {
		q, err := parseQueryLine(line)
		if err != nil || q.String() != want {
			t.Errorf("%q: %v %v, want %s", line, q, err, want)
		}
	}
	for _, line := range []string{
		"--pod 10.0.0.5 --peer 10.1.2.3", // tcp needs a port
		"--pod 10.0.0.5 --port 80",       // no peer
		"--pod 10.0.0.5 --peer 10.1.2.3 --port 80 extra",
		"--pod 10.0.0.5 --peer 10.1.2.3 --port 80 --nosuch",
		"egress 10.0.0.5",
	} {
		if q, err := parseQueryLine(line); err == nil {
			t.Errorf("%q: %v, want an error", line, q)
		}
	}
}

func TestOutputFlagRefusesOtherFormats(t *testing.T) {
	root := newRootCommand()
	root.SetArgs([]string{"--socket", "/nonexistent.sock", "status", "-o", "xml"})
	root.SetOut(&bytes.Buffer{})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), `--output "xml"`) {
		t.Errorf("status -o xml: %v", err)
	}
}
