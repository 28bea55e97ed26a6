package test

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// exitCode is the exit code of a finished command (0 for a nil error, -1
// for one that did not run).
func exitCode(err error) int {
	var exit *exec.ExitError
	if err == nil {
		return 0
	} else if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	return -1
}

// enimasq-dbg's exit codes, as cilium-dbg's: health and status exit 0 on a
// healthy agent, 1 on a degraded one (an invalid ip-masq-agent file), 2
// when the agent is not running; -o json|yaml parse; an unknown
// subcommand fails with a message.
func TestPrivilegedDbgExitCodesAndOutputs(t *testing.T) {
	a, path := ipMasqAgent(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqLinkLocalIPv6: true\n")
	a.waitPrefixes("10.0.0.0/8", "169.254.0.0/16")
	for _, args := range [][]string{{"health"}, {"status"}} {
		if out, errOut, err := a.Dbg(args...); exitCode(err) != 0 {
			t.Errorf("%v on a healthy agent: exit %d, want 0\n%s%s", args, exitCode(err), out, errOut)
		}
	}
	for _, args := range [][]string{
		{"status", "-o", "json"}, {"health", "-o", "json"}, {"version", "-o", "json"},
		{"bpf", "ipmasq", "list", "-o", "json"}, {"ipam", "list", "-o", "json"},
	} {
		out, errOut, err := a.Dbg(args...)
		var doc any
		if err != nil || json.Unmarshal([]byte(out), &doc) != nil {
			t.Errorf("%v: %v, not JSON:\n%s%s", args, err, out, errOut)
		}
	}
	var status struct {
		OK     bool                          `json:"ok"`
		Tables map[string]map[string]float64 `json:"tables"`
	}
	out, _, _ := a.Dbg("status", "-o", "yaml")
	if err := yaml.Unmarshal([]byte(out), &status); err != nil || !status.OK || status.Tables["masq-map-entries"]["done"] != 2 {
		t.Errorf("status -o yaml: %v %+v\n%s", err, status, out)
	}
	var prefixes []struct{ Map, Prefix string }
	out, _, _ = a.Dbg("bpf", "ipmasq", "list", "-o", "json")
	if json.Unmarshal([]byte(out), &prefixes); len(prefixes) != 2 || prefixes[0].Map != "cilium_ipmasq_v4" || prefixes[0].Prefix != "10.0.0.0/8" {
		t.Errorf("bpf ipmasq list -o json: %+v\n%s", prefixes, out)
	}
	if out, _, _ := a.Dbg("bpf", "ipmasq", "list"); !strings.HasPrefix(out, "MAP ") {
		t.Errorf("bpf ipmasq list has no header:\n%s", out)
	}
	if out, _, _ := a.Dbg("version"); !strings.Contains(out, "Client: ") || strings.Contains(out, "Client: dev") {
		t.Errorf("version (make build sets it):\n%s", out)
	}

	for _, args := range [][]string{{"statedb", "query"}, {"bpf", "nosuch"}, {"nosuch"}, {"bpf", "ct", "nosuch"}} {
		out, errOut, err := a.Dbg(args...)
		if exitCode(err) == 0 || !strings.Contains(errOut, `unknown command "`+args[len(args)-1]+`"`) {
			t.Errorf("%v: exit %d, want non-zero and a message\n%s%s", args, exitCode(err), out, errOut)
		}
	}
	if _, _, err := a.Dbg("status", "-o", "xml"); exitCode(err) != 1 {
		t.Errorf("status -o xml: exit %d, want 1", exitCode(err))
	}

	WriteFileAtomic(t, path, "nonMasqueradeCIDRs: [10.0.0.0/8, 100.200.0.0/61]\n")
	a.WaitFor("health degraded", func() bool { _, _, err := a.Dbg("health"); return exitCode(err) == 1 })
	out, _, err := a.Dbg("status")
	if exitCode(err) != 1 || !strings.Contains(out, "Degraded") || !strings.Contains(out, "100.200.0.0/61") {
		t.Errorf("status on a degraded agent: exit %d, want 1 and the reason\n%s", exitCode(err), out)
	}
	out, _, err = a.Dbg("status", "-o", "json")
	if json.Unmarshal([]byte(out), &status) != nil || status.OK || exitCode(err) != 1 {
		t.Errorf("status -o json on a degraded agent: exit %d\n%s", exitCode(err), out)
	}

	if _, err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"health"}, {"status"}, {"status", "-o", "json"}} {
		if _, errOut, err := a.Dbg(args...); exitCode(err) != 2 || !strings.Contains(errOut, "enimasq-agent is not running") {
			t.Errorf("%v with the agent stopped: exit %d, want 2\n%s", args, exitCode(err), errOut)
		}
	}
	if out, _, err := a.Dbg("version"); err != nil || !strings.Contains(out, "Daemon: unknown") {
		t.Errorf("version with the agent stopped: %v\n%s", err, out)
	}
}

// The verdict answers from the agent's loaded program (no load through the
// verifier per call: measured), exits 1 on DENY with --exit-code, answers
// stdin's queries in order; bpf ct list shows the connection a real packet
// opened, bpf policy pods the pod's binding, bpf progs the links and the
// programs; bugtool writes the archive.
func TestPrivilegedDbgPolicyVerdictAndMaps(t *testing.T) {
	node := newPolicyNode(t)
	node.addPod("a", "enim0a1b2c3d", podA)
	a, _ := node.startAgent(map[string]string{
		"a": policyEndpoint("a", podA, []string{"Egress"}, nil, []peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}}}),
	})
	waitAttached(a, 1)
	verdict := func(extra ...string) (string, error) {
		args := append([]string{"policy", "verdict", "--pod", podA, "--peer", policyPeerIP, "--proto", "tcp"}, extra...)
		out, _, err := a.Dbg(args...)
		return out, err
	}
	if out, err := verdict("--port", "80", "--exit-code"); err != nil || !strings.HasPrefix(out, "ALLOW") {
		t.Errorf("tcp/80: %v %s, want ALLOW and exit 0", err, out)
	}
	if out, err := verdict("--port", "81"); err != nil || !strings.HasPrefix(out, "DENY") {
		t.Errorf("tcp/81 without --exit-code: %v %s, want DENY and exit 0", err, out)
	}
	if out, err := verdict("--port", "81", "--exit-code"); exitCode(err) != 1 || !strings.HasPrefix(out, "DENY") {
		t.Errorf("tcp/81 --exit-code: exit %d %s, want DENY and exit 1", exitCode(err), out)
	}
	var v struct {
		Verdict, Program string
		Entry            struct{ Peer, Ports string }
	}
	out, _ := verdict("--port", "80", "-o", "json")
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.Verdict != "ALLOW" || v.Program != "agent" || v.Entry.Ports != "tcp/80" {
		t.Errorf("-o json: %v %+v, want ALLOW by the agent's program\n%s", err, v, out)
	}

	// 20 calls answered by the agent's loaded program, against 5 that
	// load it (another path to the same bpffs is not the agent's).
	timeCalls := func(n int, extra ...string) time.Duration {
		start := time.Now()
		for range n {
			if out, err := verdict(append([]string{"--port", "80"}, extra...)...); err != nil || !strings.HasPrefix(out, "ALLOW") {
				t.Fatalf("verdict: %v %s", err, out)
			}
		}
		return time.Since(start) / time.Duration(n)
	}
	link := filepath.Join(a.Dir, "bpf-link")
	if err := os.Symlink(a.BPFRoot, link); err != nil {
		t.Fatal(err)
	}
	if out, _ := verdict("--port", "80", "--bpf-root", link, "-o", "json"); !strings.Contains(out, `"program": "loaded"`) {
		t.Errorf("--bpf-root another path: the program should be loaded here:\n%s", out)
	}
	perCall := timeCalls(20)
	perLoad := timeCalls(5, "--bpf-root", link)
	t.Logf("policy verdict: %s a call from the agent's program (20 calls: %s), %s a call loading the program", perCall, 20*perCall, perLoad)
	if perCall > perLoad/2 {
		t.Errorf("a verdict from the agent's program takes %s, one that loads the program %s: is a program loaded per call?", perCall, perLoad)
	}

	cmd := exec.Command(Build(t).Dbg, "--state-dir", a.StateDir, "policy", "verdict", "--stdin")
	cmd.Stdin = strings.NewReader("--pod " + podA + " --peer " + policyPeerIP + " --proto tcp --port 81\n" +
		"# a comment\n\n" +
		"egress " + podA + " " + policyPeerIP + " tcp 80\n" +
		"--pod " + podA + " --peer nonsense --port 80\n" +
		"--pod " + podA + " --peer " + policyPeerIP + " --direction ingress --proto udp --port 53\n")
	stdout, err := cmd.Output()
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	if exitCode(err) != 1 || len(lines) != 4 || !strings.HasPrefix(lines[0], "DENY egress "+podA+" "+policyPeerIP+" tcp/81") ||
		!strings.HasPrefix(lines[1], "ALLOW egress") || !strings.HasPrefix(lines[2], "ERROR --pod") ||
		!strings.HasPrefix(lines[3], "ALLOW ingress "+podA+" "+policyPeerIP+" udp/53") {
		t.Errorf("--stdin: exit %d (want 1: a query failed), answers in order:\n%s", exitCode(err), stdout)
	}

	// A real connection, tracked on the pod's device.
	if !node.connect(node.podNS("a"), policyPeerIP, 80) {
		t.Fatal("the allowed connection to the peer's port 80 failed")
	}
	out = a.MustDbg("bpf", "ct", "list")
	if !strings.HasPrefix(out, "IFINDEX") || !regexpMatch(`\n\d+\s+enim0a1b2c3d\s+tcp\s+`+podA+`:\d+\s+`+policyPeerIP+`:80\s+egress\s+`, out) {
		t.Errorf("bpf ct list does not show the connection:\n%s", out)
	}
	var conns []struct {
		Device   string
		Pod      string
		PeerPort int
		OpenedBy string
	}
	out = a.MustDbg("bpf", "ct", "list", "-o", "json")
	if json.Unmarshal([]byte(out), &conns); !slices.ContainsFunc(conns, func(c struct {
		Device   string
		Pod      string
		PeerPort int
		OpenedBy string
	}) bool {
		return c.Device == "enim0a1b2c3d" && c.Pod == podA && c.PeerPort == 80 && c.OpenedBy == "egress"
	}) {
		t.Errorf("bpf ct list -o json:\n%s", out)
	}
	if out := a.MustDbg("bpf", "policy", "pods"); !regexpMatch(`^POD\s+IFINDEX\s+DEVICE\n`+podA+`\s+\d+\s+enim0a1b2c3d\n$`, out) {
		t.Errorf("bpf policy pods:\n%s", out)
	}
	if out := a.MustDbg("bpf", "policy", "list"); !strings.HasPrefix(out, "MAP POD PEER PORTS\n") ||
		!strings.Contains(out, "enimasq_egress_v4 "+podA+" "+policyPeerIP+"/32 tcp/80") {
		t.Errorf("bpf policy list:\n%s", out)
	}
	var progs struct {
		Links []struct {
			ID, ProgramID int
			Device        string
			Attach        string
		}
		Programs []struct {
			ID     int
			Name   string
			MapIDs []int
		}
		Maps []struct{ Name string }
	}
	out = a.MustDbg("bpf", "progs", "-o", "json")
	if err := json.Unmarshal([]byte(out), &progs); err != nil || len(progs.Links) != 2 || len(progs.Programs) != 2 {
		t.Fatalf("bpf progs -o json: %v, want the device's two links and their programs\n%s", err, out)
	}
	for _, l := range progs.Links {
		if l.Device != "enim0a1b2c3d" || l.ID == 0 || !slices.ContainsFunc(progs.Programs, func(p struct {
			ID     int
			Name   string
			MapIDs []int
		}) bool {
			return p.ID == l.ProgramID && strings.HasPrefix(p.Name, "policy_") && len(p.MapIDs) > 0
		}) {
			t.Errorf("link %+v: not on the pod's device, or its program not listed\n%s", l, out)
		}
	}
	if out := a.MustDbg("bpf", "progs"); !strings.HasPrefix(out, "LINK ") || !strings.Contains(out, "enimasq_policy_ct") {
		t.Errorf("bpf progs:\n%s", out)
	}

	logFile := filepath.Join(a.Dir, "agent.log")
	if err := os.WriteFile(logFile, []byte(a.Log()), 0o600); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(a.Dir, "bugtool.tar.gz")
	if out, errOut, err := a.Dbg("bugtool", "--archive", archive, "--log-file", logFile, "--netns", node.Node); err != nil {
		t.Fatalf("bugtool: %v\n%s%s", err, out, errOut)
	}
	files := readArchive(t, archive)
	for _, name := range []string{"version.txt", "health.json", "status.txt", "status.json", "config.json", "metrics.txt",
		"statedb.json", "bpf-policy-list.txt", "bpf-policy-pods.txt", "bpf-ct-list.txt", "bpf-progs.txt", "bpf-progs.json",
		"ip-rules.txt", "ip-routes.txt", "ip-links.txt", "logs/agent.log", "errors.txt"} {
		if _, ok := files[name]; !ok {
			t.Errorf("the archive has no %s: %v", name, slices.Sorted(maps.Keys(files)))
		}
	}
	if !strings.Contains(files["bpf-ct-list.txt"], policyPeerIP+":80") || !strings.Contains(files["ip-routes.txt"], "enim0a1b2c3d") ||
		!strings.Contains(files["statedb.json"], "policy-attachments") || !strings.Contains(files["logs/agent.log"], "level=") {
		t.Errorf("the archive's files lack what they hold:\nct: %s\nroutes: %s\nerrors: %s", files["bpf-ct-list.txt"], files["ip-routes.txt"], files["errors.txt"])
	}
}

// readArchive reads a tar.gz whose files are under one directory: name
// (without the directory) -> content.
func readArchive(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		} else if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		_, name, _ := strings.Cut(hdr.Name, "/")
		files[name] = string(data)
	}
}

func regexpMatch(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }
