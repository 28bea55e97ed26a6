package agenttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/enimasq/enimasq/test/k8stest"
)

// bins are the binaries of make cilium-agent: the agent with enimasq's
// cells and Cilium's own tools, in $ENIMASQ_BIN.
type bins struct {
	dir                        string
	agent, cni, dbg, responder string
	upstream                   string // Cilium's agent without enimasq's cells
	llvm                       string // clang and llc
}

// findBins finds the binaries and the tools Cilium's agent needs at run time
// (clang and llc, iptables). Missing, the test is skipped, or fails when
// make test runs it ($ENIMASQ_REQUIRE_K8S).
func findBins(t testing.TB) bins {
	t.Helper()
	fail := t.Skipf
	if os.Getenv(k8stest.RequireEnv) != "" {
		fail = t.Fatalf
	}
	dir := os.Getenv("ENIMASQ_BIN")
	if dir == "" {
		fail("$ENIMASQ_BIN is not set: run make test-cilium (make cilium-agent builds the binaries)")
	}
	b := bins{dir: dir, agent: filepath.Join(dir, "cilium-agent"), cni: filepath.Join(dir, "cilium-cni"),
		dbg: filepath.Join(dir, "cilium-dbg"), responder: filepath.Join(dir, "cilium-health-responder"),
		upstream: filepath.Join(dir, "cilium-agent-upstream")}
	for _, p := range []string{b.agent, b.cni, b.dbg, b.responder} {
		if !fileExists(p) {
			fail("%s is missing: run make cilium-agent", p)
		}
	}
	for _, dir := range []string{"/usr/lib/llvm-19/bin", "/usr/lib/llvm-18/bin", "/usr/lib/llvm-17/bin"} {
		if fileExists(filepath.Join(dir, "clang")) && fileExists(filepath.Join(dir, "llc")) {
			b.llvm = dir
			break
		}
	}
	if b.llvm == "" {
		fail("Cilium's agent compiles its datapath with clang and llc: install clang-19 llvm-19 (.ci/run does)")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		fail("Cilium's BPF masquerade needs iptables: install iptables (.ci/run does)")
	}
	return b
}

// ciliumModuleDir is the Cilium module's source, for its bpf/ and CRDs.
func ciliumModuleDir(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/cilium/cilium").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/cilium/cilium: %s", err)
	}
	return strings.TrimSpace(string(out))
}

// copyTree copies dir to dst (the module cache is read-only; Cilium writes
// next to its bpf sources).
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// agent is bin/cilium-agent run as a user runs it, in the node namespace,
// in a mount namespace of its own with a tmpfs over /run.
type agent struct {
	t          testing.TB
	b          bins
	node       *node
	dir        string
	args       []string
	sock       string
	shellSock  string
	configPath string
	cmd        *exec.Cmd
	log        *os.File
	starts     int
	// binary is bin/cilium-agent, or Cilium's own (upstream), which has
	// none of enimasq's flags.
	binary string
}

func newAgent(t testing.TB, b bins, n *node, cluster *k8stest.Cluster, bpfRoot, libDir string) *agent {
	dir := t.TempDir()
	a := &agent{t: t, b: b, node: n, dir: dir,
		sock:       filepath.Join(dir, "cilium.sock"),
		shellSock:  filepath.Join(dir, "shell.sock"),
		configPath: filepath.Join(dir, "ip-masq-agent", "config"),
	}
	a.args = []string{
		"--k8s-kubeconfig-path=" + cluster.Kubeconfig,
		"--state-dir=" + filepath.Join(dir, "state"),
		"--socket-path=" + a.sock,
		"--shell-sock-path=" + a.shellSock,
		"--bpf-root=" + bpfRoot,
		"--lib-dir=" + libDir,
		"--cgroup-root=" + filepath.Join(dir, "cgroup"),
		"--ipam=eni",
		"--eni-first-interface-index=1", // what the agent writes into the CiliumNode's spec.eni
		"--routing-mode=native",
		"--ipv4-native-routing-cidr=" + vpcCIDR.String(),
		"--enable-ipv4=true",
		"--enable-ipv6=false",
		"--enable-endpoint-routes",
		"--enable-bpf-masquerade",
		"--enable-ip-masq-agent",
		"--ip-masq-agent-config-path=" + a.configPath,
		"--kube-proxy-replacement=false",
		"--bpf-lb-sock=false",
		"--cni-exclusive=false",
		"--enable-hubble=false",
		"--enable-l7-proxy=false",
		"--enable-envoy-config=false",
		"--devices=" + eni0.link(),
		"--prometheus-serve-addr=",
	}
	a.binary = b.agent
	return a
}

// enimasqFlags are enimasq's own flags: its netlink retries, faster than
// the defaults for a test.
var enimasqFlags = []string{"--eni-netlink-retry-min=20ms", "--eni-netlink-retry-max=500ms"}

// start starts the agent and waits until cilium-dbg status says Cilium is
// Ok.
func (a *agent) start() {
	t := a.t
	t.Helper()
	a.starts++
	logPath := filepath.Join(a.dir, fmt.Sprintf("agent-%d.log", a.starts))
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	a.log = f
	// ip netns exec gives the agent the node's network namespace and a
	// sysfs of it; unshare a private /run (Cilium's runtime files), so that
	// nothing of the machine's is touched.
	shell := `mount -t tmpfs tmpfs /run && exec "$@"`
	a.cmd = exec.Command("ip", append([]string{"netns", "exec", a.node.name, "unshare", "--mount", "--propagation", "private",
		"sh", "-c", shell, "sh", a.binary}, a.flags()...)...)
	a.cmd.Env = append(os.Environ(),
		"PATH="+a.b.llvm+":"+a.b.dir+":"+os.Getenv("PATH"),
		"K8S_NODE_NAME="+nodeName,
		"CILIUM_K8S_NAMESPACE=kube-system",
	)
	a.cmd.Stdout, a.cmd.Stderr = f, f
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.stop)
	start := time.Now()
	a.waitFor("Cilium: Ok", 4*time.Minute, func() (bool, string) {
		out, err := a.dbgErr("status")
		return err == nil && strings.Contains(out, "Cilium:") && regexpCiliumOK(out), out
	})
	t.Logf("cilium-agent (start %d) Ok after %s", a.starts, time.Since(start).Round(time.Second))
}

func (a *agent) flags() []string {
	if a.binary == a.b.upstream {
		return a.args
	}
	return append(slices.Clone(a.args), enimasqFlags...)
}

func regexpCiliumOK(status string) bool {
	for _, line := range strings.Split(status, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "Cilium:") {
			return strings.Contains(line, "Ok")
		}
	}
	return false
}

// stop stops the agent with SIGTERM, as the kubelet does.
func (a *agent) stop() {
	if a.cmd == nil || a.cmd.Process == nil {
		return
	}
	cmd := a.cmd
	a.cmd = nil
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
	}
	a.log.Close()
	if a.t.Failed() {
		a.dumpLog()
	}
}

func (a *agent) dumpLog() {
	data, _ := os.ReadFile(a.log.Name())
	if len(data) > 20000 {
		data = data[len(data)-20000:]
	}
	a.t.Logf("%s (end):\n%s", a.log.Name(), data)
	a.node.imdsMu.Lock()
	a.t.Logf("metadata requests:\n%s", a.node.imdsLog.String())
	a.node.imdsMu.Unlock()
}

// dbg runs cilium-dbg against the agent's socket.
func (a *agent) dbg(args ...string) string {
	a.t.Helper()
	out, err := a.dbgErr(args...)
	if err != nil {
		a.t.Fatalf("cilium-dbg %s: %s\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (a *agent) dbgErr(args ...string) (string, error) {
	cmd := exec.Command(a.b.dbg, append([]string{"-H", "unix://" + a.sock}, args...)...)
	if args[0] == "shell" {
		cmd = exec.Command(a.b.dbg, append([]string{"shell", "--shell-sock-path=" + a.shellSock, "--"}, args[1:]...)...)
	}
	cmd.Env = append(os.Environ(), "CILIUM_SOCK="+a.sock) // some commands ignore -H
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// waitFor polls cond (it reads the kernel or asks cilium-dbg, neither of
// which can be watched from here) until it holds, failing after timeout
// with the last detail.
func (a *agent) waitFor(what string, timeout time.Duration, cond func() (bool, string)) time.Duration {
	a.t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return time.Since(start)
		}
		if a.cmd != nil && a.cmd.ProcessState != nil {
			a.t.Fatalf("%s: the agent exited", what)
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("%s: not after %s; last:\n%s", what, timeout, detail)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// writeConfig writes the ip-masq-agent config the way a ConfigMap update
// arrives: a new file renamed over the old.
func (a *agent) writeConfig(cidrs ...string) {
	a.t.Helper()
	data, _ := json.Marshal(map[string]any{"nonMasqueradeCIDRs": cidrs})
	a.writeConfigData(data)
}

// writeConfigData replaces the ip-masq-agent file with data, atomically.
func (a *agent) writeConfigData(data []byte) {
	a.t.Helper()
	if err := os.MkdirAll(filepath.Dir(a.configPath), 0o755); err != nil {
		a.t.Fatal(err)
	}
	tmp := a.configPath + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		a.t.Fatal(err)
	}
	if err := os.Rename(tmp, a.configPath); err != nil {
		a.t.Fatal(err)
	}
}

// pod is a pod sandbox: a network namespace that cilium-cni plumbs.
type pod struct {
	namespace, name, containerID, netns string
	ip                                  netip.Addr
}

// cni runs Cilium's cilium-cni in the node namespace, as the container
// runtime does.
func (a *agent) cni(command string, p *pod) (string, error) {
	conf := map[string]any{
		"cniVersion": "0.3.1", "name": "cilium", "type": "cilium-cni",
		"enable-debug": true, "log-file": filepath.Join(a.dir, "cilium-cni.log"),
	}
	data, _ := json.Marshal(conf)
	cmd := exec.Command("nsenter", "--net=/run/netns/"+a.node.name, a.b.cni)
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+command,
		"CNI_CONTAINERID="+p.containerID,
		"CNI_NETNS=/run/netns/"+p.netns,
		"CNI_IFNAME=eth0",
		"CNI_PATH="+a.b.dir,
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE="+p.namespace+";K8S_POD_NAME="+p.name+";K8S_POD_INFRA_CONTAINER_ID="+p.containerID,
		"CILIUM_SOCK="+a.sock,
	)
	cmd.Stdin = bytes.NewReader(data)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("cilium-cni %s %s: %w\n%s%s", command, p.name, err, out.String(), errOut.String())
	}
	return out.String(), nil
}

func (a *agent) cniAdd(p *pod) {
	a.t.Helper()
	out, err := a.cni("ADD", p)
	// Cilium's multi-pool IPAM hands back the IPs it holds beyond its
	// pre-allocation and takes them again as demand grows, at its CiliumNode
	// update rate: a burst of ADDs can find it short for a while. The
	// kubelet then deletes the sandbox and tries again; so does this.
	for deadline := time.Now().Add(time.Minute); err != nil && strings.Contains(err.Error(), "exhausted") && time.Now().Before(deadline); {
		a.cni("DEL", p)
		time.Sleep(time.Second)
		out, err = a.cni("ADD", p)
	}
	if err != nil {
		a.t.Fatal(err)
	}
	var result struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal([]byte(out), &result); err != nil || len(result.IPs) == 0 {
		a.t.Fatalf("cilium-cni ADD %s: result %q: %v", p.name, out, err)
	}
	pre, err := netip.ParsePrefix(result.IPs[0].Address)
	if err != nil {
		a.t.Fatal(err)
	}
	p.ip = pre.Addr()
}
