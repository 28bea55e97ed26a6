package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	upstream "github.com/cilium/hive"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cilium/cilium/daemon/cmd"
	"github.com/cilium/cilium/pkg/hive"

	"github.com/enimasq/enimasq"
	"github.com/enimasq/enimasq/cells/infra"
	"github.com/enimasq/enimasq/cmd/cilium-agent/ciliumlink"
)

func flagNames(fs *pflag.FlagSet) map[string]bool {
	names := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) { names[f.Name] = true })
	return names
}

// TestFlagsAgainstCilium builds Cilium v1.20.2's agent command with
// enimasq's cells, as main does. A flag declared twice panics there (hive:
// "declared twice", pflag: "flag redefined"), so building it is the check
// that enimasq's own flags do not collide with any of Cilium's. It also
// checks that the standalone agent's node flags, the settings Cilium owns,
// are Cilium's flags by name, so one command line means the same to both.
func TestFlagsAgainstCilium(t *testing.T) {
	var root *cobra.Command
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("cilium-agent with enimasq's cells: %v", r)
			}
		}()
		root = cmd.NewAgentCmd(func() *hive.Hive { return hive.New(cmd.Agent, ciliumlink.Cell) })
		markEnimasqFlags(root)
	}()
	all := flagNames(root.Flags())

	// enimasq's flags say so in the help; those that do nothing in this
	// build are not flags of it.
	own := pflag.NewFlagSet("enimasq", pflag.ContinueOnError)
	upstream.New(enimasq.Features).RegisterFlags(own)
	for name := range flagNames(own) {
		f := root.Flags().Lookup(name)
		switch {
		case notInCiliumBuild[name] && f != nil:
			t.Errorf("enimasq flag --%s does nothing in the Cilium build but is registered", name)
		case notInCiliumBuild[name]:
		case f == nil:
			t.Errorf("enimasq flag --%s is not in cilium-agent's flags", name)
		case !strings.HasPrefix(f.Usage, "(enimasq) "):
			t.Errorf("enimasq flag --%s: help %q does not say (enimasq)", name, f.Usage)
		}
	}
	root.Flags().VisitAll(func(f *pflag.Flag) {
		if own.Lookup(f.Name) == nil && strings.Contains(f.Usage, "(enimasq)") {
			t.Errorf("Cilium's flag --%s says (enimasq)", f.Name)
		}
	})
	if err := root.ParseFlags([]string{"--network-policy-attach=tcx"}); err == nil || !strings.Contains(err.Error(), "unknown flag") {
		t.Errorf("--network-policy-attach in the Cilium build: %v, want unknown flag", err)
	}
	if len(notInCiliumBuild) == 0 {
		t.Error("notInCiliumBuild is empty")
	}

	standalone := pflag.NewFlagSet("enimasq-agent", pflag.ContinueOnError)
	upstream.New(infra.NodeConfigCell).RegisterFlags(standalone)
	for name := range flagNames(standalone) {
		if !all[name] || own.Lookup(name) != nil {
			t.Errorf("standalone flag --%s is not one of Cilium's: it would mean something else in cilium-agent", name)
		}
	}
	if len(all) < 400 {
		t.Errorf("only %d flags: not Cilium's full flag set", len(all))
	}
}

// TestAgentBinary builds bin/cilium-agent as make cilium-agent does (or takes
// $ENIMASQ_BIN/cilium-agent, which make test-cilium has just built) and runs
// `cilium-agent hive` (constructs every cell and invoke, starts nothing) and
// `cilium-agent --help` (every flag listed once).
func TestAgentBinary(t *testing.T) {
	goTool := os.Getenv("GO")
	if goTool == "" {
		goTool = "go"
	}
	bin := filepath.Join(os.Getenv("ENIMASQ_BIN"), "cilium-agent")
	if os.Getenv("ENIMASQ_BIN") == "" {
		bin = filepath.Join(t.TempDir(), "cilium-agent")
		if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}

	hiveCmd := exec.Command(bin, "hive")
	hiveCmd.Env = append(os.Environ(), "CILIUM_IPAM=eni", "CILIUM_ENABLE_BPF_MASQUERADE=true", "CILIUM_ENABLE_IP_MASQ_AGENT=true")
	out, err := hiveCmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cilium-agent hive: %v\n%s", err, tail(out))
	}
	for _, module := range []string{"enimasq", "ipmasq", "policymap", "ipam"} {
		if !regexp.MustCompile(`Ⓜ️ ` + module + ` \(`).Match(out) {
			t.Errorf("cilium-agent hive does not list module %s", module)
		}
	}
	if !strings.Contains(string(out), "ciliumlink.disableCiliumIPMasqWriter") {
		t.Errorf("cilium-agent hive: Cilium's ip-masq-agent writer is not turned off")
	}

	help, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("cilium-agent --help: %v\n%s", err, tail(help))
	}
	seen := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllSubmatch(help, -1) {
		seen[string(m[1])]++
	}
	for name, n := range seen {
		if n != 1 {
			t.Errorf("--%s listed %d times", name, n)
		}
	}
	for _, name := range []string{"enable-ip-masq-agent", "ip-masq-agent-config-path", "ipam", "eni-egress-rule-mode", "ciliumnode-path", "bpf-map-retry-min"} {
		if seen[name] != 1 {
			t.Errorf("--%s: listed %d times, want once", name, seen[name])
		}
	}
	for name := range notInCiliumBuild {
		if seen[name] != 0 {
			t.Errorf("--%s: listed, but it does nothing in the Cilium build", name)
		}
	}
	if !regexp.MustCompile(`(?m)^\s+--eni-egress-rule-mode string\s+\(enimasq\) `).Match(help) {
		t.Errorf("cilium-agent --help: --eni-egress-rule-mode does not say (enimasq)")
	}

	// Cilium's version, as Cilium's Makefile sets it (build.sh, which make
	// test-cilium ran), in the agent and in Cilium's cilium-dbg beside it.
	if dir := os.Getenv("ENIMASQ_BIN"); dir != "" {
		version, err := exec.Command(bin, "--version").CombinedOutput()
		if err != nil || !regexp.MustCompile(`^cilium-agent 1\.20\.2 \S+ \S+ go version go`).Match(version) {
			t.Errorf("cilium-agent --version: %q, %v; want Cilium's version 1.20.2, a revision and a date", version, err)
		}
		dbg := exec.Command(filepath.Join(dir, "cilium-dbg"), "version")
		dbg.Env = append(os.Environ(), "CILIUM_SOCK="+filepath.Join(t.TempDir(), "no-agent.sock"))
		out, _ := dbg.CombinedOutput()
		if !regexp.MustCompile(`(?m)^Client: 1\.20\.2 \S+ \S+ go version go`).Match(out) {
			t.Errorf("cilium-dbg version: %q; want the client's version 1.20.2", out)
		}
	}
}

func tail(b []byte) []byte {
	if len(b) > 4000 {
		return b[len(b)-4000:]
	}
	return b
}
