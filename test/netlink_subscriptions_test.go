package test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPrivilegedOneNetlinkSubscription: the agent with every part that
// follows the kernel on (node IPs, the ENI IPAM's repair of rules and
// routes, network-policy enforcement's pod devices) holds exactly one
// rtnetlink socket in multicast groups: cells/kernel's. The others derive
// from its tables.
func TestPrivilegedOneNetlinkSubscription(t *testing.T) {
	requireIPAM(t)
	a, _, _ := ipamAgent(t)
	pe := filepath.Join(a.Dir, "pe")
	if err := os.Mkdir(pe, 0o755); err != nil {
		t.Fatal(err)
	}
	a.Args = append(a.Args, "--enable-network-policy", "--policy-endpoints-path", pe)
	a.Start()
	a.WaitHealthy()
	AddENILinks(t, a.NetNS())
	// Every job has started by now; a subscription made late would show
	// within these samples.
	for range 25 {
		if subs := netlinkSubscriptions(t, a.cmd.Process.Pid); len(subs) != 1 {
			t.Fatalf("%d rtnetlink sockets with multicast groups, want 1: %v", len(subs), subs)
		}
		time.Sleep(40 * time.Millisecond)
	}
}

// netlinkSubscriptions are the NETLINK_ROUTE sockets of process pid that
// listen to multicast groups, as "inode groups" (/proc/PID/net/netlink:
// the sockets of its network namespace; /proc/PID/fd: those it holds).
func netlinkSubscriptions(t *testing.T, pid int) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name()))
		if inode, ok := strings.CutPrefix(target, "socket:["); err == nil && ok {
			held[strings.TrimSuffix(inode, "]")] = true
		}
	}
	table, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/net/netlink")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	// sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
	for _, line := range strings.Split(string(table), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[1] != "0" || !held[f[9]] {
			continue
		}
		if groups, err := strconv.ParseUint(f[3], 16, 32); err == nil && groups != 0 {
			out = append(out, f[9]+" groups "+f[3])
		}
	}
	return out
}
