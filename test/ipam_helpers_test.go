package test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// requireIPAM skips when the binaries under test have no ENI IPAM (ipam.Cell
// not linked into the agent, or the enimasq-dbg ipam command not registered).
func requireIPAM(t *testing.T) {
	t.Helper()
	out, err := exec.Command(Build(t).Agent, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("enimasq-agent --help: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--ciliumnode-path") {
		t.Skip("enimasq-agent has no ENI IPAM (ipam.Cell is not in enimasq.Features)")
	}
	if out, err := exec.Command(Build(t).Dbg, "ipam", "--help").CombinedOutput(); err != nil {
		t.Skipf("enimasq-dbg has no ipam command (ipamCommand is not registered in root.go): %v %s", err, out)
	}
}

// ipamAgent prepares (does not start) an agent on the sample CiliumNode and
// ip-masq-agent config, and returns it with the two file paths.
func ipamAgent(t *testing.T) (a *Agent, config, node string) {
	a = NewAgent(t)
	config = filepath.Join(a.Dir, "config", "ip-masq-agent")
	node = filepath.Join(a.Dir, "node", "ciliumnode.yaml")
	for src, dst := range map[string]string{"ip-masq-agent.yaml": config, "ciliumnode.yaml": node} {
		data, err := os.ReadFile(filepath.Join("testdata", "samples", src))
		if err != nil {
			t.Fatal(err)
		}
		WriteFileAtomic(t, dst, string(data))
	}
	a.Args = append(a.Args,
		"--enable-ip-masq-agent", "--enable-bpf-masquerade", "--ip-masq-agent-config-path", config,
		"--ciliumnode-path", node, "--eni-netlink-retry-min=20ms", "--eni-netlink-retry-max=200ms")
	return a, config, node
}

// NetNS returns a handle on the running agent's network namespace. The
// handle keeps the namespace alive after the agent dies; it is closed at
// cleanup.
func (a *Agent) NetNS() netns.NsHandle {
	a.t.Helper()
	ns, err := netns.GetFromPid(a.cmd.Process.Pid)
	if err != nil {
		a.t.Fatalf("agent netns: %s", err)
	}
	a.t.Cleanup(func() { ns.Close() })
	return ns
}

// sampleENILinks are links with the MACs of the sample CiliumNode's ENIs.
var sampleENILinks = map[string]string{
	"eni0": "0a:58:0a:82:00:0a",
	"eni1": "0a:58:0a:82:64:0a",
	"eni2": "0a:58:0a:82:70:0a",
}

// AddENILinks adds up links with the sample ENIs' MACs to the namespace:
// dummies, or ifbs where the kernel has no dummy driver.
func AddENILinks(t testing.TB, ns netns.NsHandle) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for name, mac := range sampleENILinks {
		hw, _ := net.ParseMAC(mac)
		attrs := netlink.LinkAttrs{Name: name, HardwareAddr: hw}
		if err := h.LinkAdd(&netlink.Dummy{LinkAttrs: attrs}); err != nil {
			if err := h.LinkAdd(&netlink.Ifb{LinkAttrs: attrs}); err != nil {
				t.Fatalf("add link %s: %s", name, err)
			}
		}
		link, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(link)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// inNetNS is a command run in the namespace through nsenter (the namespace
// is passed as fd 3).
func inNetNS(t testing.TB, ns netns.NsHandle, name string, args ...string) *exec.Cmd {
	t.Helper()
	fd, err := unix.Dup(int(ns))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", append([]string{"--net=/proc/self/fd/3", "--", name}, args...)...)
	cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(fd), "netns")}
	return cmd
}

// IPRules runs `ip rule` in the namespace and returns the lines with
// enimasq's protocol (237), sorted.
func IPRules(t testing.TB, ns netns.NsHandle) []string {
	t.Helper()
	cmd := inNetNS(t, ns, "ip", "rule")
	out, err := cmd.Output()
	cmd.ExtraFiles[0].Close()
	if err != nil {
		t.Fatalf("ip rule: %v", err)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasSuffix(l, " proto 237") {
			lines = append(lines, strings.TrimSuffix(l, " proto 237"))
		}
	}
	sort.Strings(lines)
	return lines
}

// IPRoutes runs `ip route show table <table>` in the namespace.
func IPRoutes(t testing.TB, ns netns.NsHandle, table string) string {
	t.Helper()
	cmd := inNetNS(t, ns, "ip", "route", "show", "table", table)
	out, err := cmd.Output()
	cmd.ExtraFiles[0].Close()
	if err != nil {
		t.Fatalf("ip route: %v", err)
	}
	return string(out)
}

// Kill9 kills the agent with SIGKILL and waits for it.
func (a *Agent) Kill9() {
	a.t.Helper()
	a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.exited
}

// StartInNetNS starts the agent again, in the given network namespace
// (through nsenter) instead of a new one, with the same state dir: a
// restart on the same node.
func (a *Agent) StartInNetNS(ns netns.NsHandle) {
	a.t.Helper()
	base := a.Command()
	a.cmd = inNetNS(a.t, ns, base.Path, base.Args[1:]...)
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	a.stderr = &syncBuffer{}
	a.cmd.Stderr = a.stderr
	a.cmd.Stdout = a.stderr
	err := a.cmd.Start()
	a.cmd.ExtraFiles[0].Close()
	if err != nil {
		a.t.Fatalf("start agent: %s", err)
	}
	a.exited = make(chan struct{})
	cmd, exited := a.cmd, a.exited
	go func() {
		a.err = cmd.Wait()
		close(exited)
	}()
	a.t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
}
