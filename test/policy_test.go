package test

import (
	"path/filepath"
	"strings"
	"testing"
)

// The sample PolicyEndpoint (an IPv6 ipBlock with excepts) on an IPv4-only
// node, through the real binaries: the v4 maps hold only valid v4 keys, the
// datapath program decides as the policy says, and an edit of a destination
// pod IP moves the allow.
func TestPrivilegedNetworkPolicyFromFilesThroughTheBinaries(t *testing.T) {
	a := NewAgent(t)
	dir := filepath.Join(a.Dir, "policyendpoints")
	path := filepath.Join(dir, "web.yaml")
	pe := sample(t, "policyendpoint-v6-except.yaml")
	WriteFileAtomic(t, path, pe)
	a.Args = append(a.Args, "--enable-network-policy", "--policy-endpoints-path", dir)
	a.Start()
	a.WaitHealthy()

	list := func() string {
		out, _, _ := a.Dbg("bpf", "policy", "list")
		return out
	}
	a.WaitFor("policy maps programmed", func() bool { return strings.Contains(list(), "10.130.112.20/32 tcp/8080") })
	out := list()
	if strings.Contains(out, "_v6") || strings.Contains(out, ":") {
		t.Errorf("IPv6 keys on an IPv4-only node:\n%s", out)
	}
	if strings.Contains(out, "254.128.0.0") || strings.Contains(out, "/64") {
		t.Errorf("fe80::/10 or 100::/64 left a trace in the v4 map:\n%s", out)
	}
	show := a.MustDbg("shell", "--", "db/show", "policy-endpoints")
	if !strings.Contains(show, "IPv6 is disabled on this node") {
		t.Errorf("the skipped IPv6 rule is not shown:\n%s", show)
	}

	verdict := func(peer, proto, port string) string {
		t.Helper()
		out, _, _ := a.Dbg("policy", "verdict", "--pod", "10.130.100.133",
			"--direction", "egress", "--peer", peer, "--proto", proto, "--port", port)
		verdict, _, _ := strings.Cut(out, " ")
		return verdict
	}
	for _, tc := range []struct{ peer, proto, port, want string }{
		{"10.130.112.20", "tcp", "8080", "ALLOW"},
		{"10.130.112.21", "tcp", "8080", "DENY"},
		{"10.1.2.3", "udp", "53", "ALLOW"},
		{"10.130.5.5", "udp", "53", "DENY"},      // the except
		{"10.130.0.10", "tcp", "10250", "ALLOW"}, // the node (kubelet probes)
		{"254.128.0.1", "tcp", "443", "DENY"},
	} {
		if got := verdict(tc.peer, tc.proto, tc.port); got != tc.want {
			t.Errorf("%s %s/%s: %s, want %s", tc.peer, tc.proto, tc.port, got, tc.want)
		}
	}

	// Endpoint churn: the destination pod moves to another IP.
	WriteFileAtomic(t, path, strings.Replace(pe, "cidr: 10.130.112.20/32", "cidr: 10.130.112.21/32", 1))
	a.WaitFor("allow moved to 10.130.112.21", func() bool {
		out := list()
		return strings.Contains(out, "10.130.112.21/32 tcp/8080") && !strings.Contains(out, "10.130.112.20/32")
	})
	if got := verdict("10.130.112.20", "tcp", "8080"); got != "DENY" {
		t.Errorf("the old destination is still allowed: %s", got)
	}
}
