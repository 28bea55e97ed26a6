package test

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/enimasq/enimasq/cells/celltest"
)

// --policy-audit-mode, as Cilium's: a deny-all pod (both directions
// isolated, nothing allowed) keeps all its traffic, TCP and UDP, both
// ways; every packet the policy denies is counted verdict="audit" (none
// "deny"), exactly, logged as "Policy would deny" and served as an audited
// event; status shows the mode. Restarted without the flag, the agent
// denies the same traffic at once.
func TestPrivilegedNetworkPolicyAuditMode(t *testing.T) {
	node := newPolicyNode(t)
	node.addPod("a", "enim1a1a1a1a", podA)
	const sinkPort = 9999
	var sunk atomic.Int64
	if err := celltest.InNS(node.ns[node.podNS("a")], func() error {
		return listenUDP(t, "udp4", net.JoinHostPort(podA, strconv.Itoa(sinkPort)), func(net.PacketConn, []byte, net.Addr) { sunk.Add(1) })
	}); err != nil {
		t.Fatal(err)
	}
	denyAll := map[string]string{"a": policyEndpoint("a", podA, []string{"Ingress", "Egress"}, nil, nil)}
	a, _ := node.startAgent(denyAll, "--policy-audit-mode", "--policy-event-logs")
	waitAttached(a, 1)

	if !node.connect(node.peerNS(), podA, 80) || !node.connect(node.podNS("a"), policyPeerIP, 443) {
		t.Fatal("audit mode: the deny-all pod's TCP does not pass")
	}
	if !node.udp(node.peerNS(), podA, 53) || !node.udp(node.podNS("a"), policyPeerIP, 53) {
		t.Fatal("audit mode: the deny-all pod's UDP does not pass")
	}

	// A flow of datagrams to a sink (no answer, so nothing tracks the
	// flow): every one is judged and counted as audited.
	const ingressAudit = "enimasq_policy_verdicts_total,direction=ingress,tier=namespace,verdict=audit"
	before := agentMetrics(t, a)
	const flood = 200
	if err := celltest.InNS(node.ns[node.peerNS()], func() error {
		c, err := net.Dial("udp4", net.JoinHostPort(podA, strconv.Itoa(sinkPort)))
		if err != nil {
			return err
		}
		defer c.Close()
		for range flood {
			if _, err := c.Write([]byte("x")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	a.WaitFor("the datagrams at the sink", func() bool { return sunk.Load() == flood })
	after := agentMetrics(t, a)
	if got := after[ingressAudit] - before[ingressAudit]; got != flood {
		t.Errorf("%s grew by %g for %d datagrams the policy denies, want %d", ingressAudit, got, flood, flood)
	}
	for key, n := range after {
		if strings.HasPrefix(key, "enimasq_policy_verdicts_total,") && strings.HasSuffix(key, "verdict=deny") && n != 0 {
			t.Errorf("%s = %g in audit mode, want 0", key, n)
		}
	}
	if after["enimasq_policy_enforcement_info,audit=true,mode=standard"] != 1 {
		t.Errorf("enimasq_policy_enforcement_info does not say audit mode: %v", after)
	}

	// Logged as "would deny" (rate-limited per pod and reason), served as
	// audited events.
	a.WaitFor("a would-deny log line", func() bool { return strings.Contains(a.Log(), `msg="Policy would deny (audit mode: passed)"`) })
	if log := a.Log(); strings.Contains(log, `msg="Policy denied"`) {
		t.Errorf("audit mode logged \"Policy denied\":\n%s", log)
	}
	events := a.MustDbg("policy", "events", "--follow=false", "-o", "json")
	if !strings.Contains(events, `"audited": true`) && !strings.Contains(events, `"audited":true`) {
		t.Errorf("the events served are not audited:\n%.2000s", events)
	}
	if lines := a.MustDbg("policy", "events", "--follow=false"); !strings.Contains(lines, "AUDIT (passed, would deny): ") {
		t.Errorf("policy events does not mark the audited packets:\n%.2000s", lines)
	}
	if v := a.MustDbg("policy", "verdict", "--pod", podA, "--peer", policyPeerIP, "--direction", "ingress", "--proto", "tcp", "--port", "80"); !strings.HasPrefix(v, "AUDIT ") {
		t.Errorf("policy verdict in audit mode: %s, want AUDIT", v)
	}
	if status, _, _ := a.Dbg("status"); !strings.Contains(status, "AUDIT MODE") {
		t.Errorf("status does not show audit mode:\n%s", status)
	}

	// Off: once the next agent has started, the same traffic is denied
	// (until then the programs left attached keep the mode in the kernel).
	ns := a.NetNS()
	a.Kill9()
	a.Args = slices.DeleteFunc(a.Args, func(arg string) bool { return arg == "--policy-audit-mode" })
	a.StartInNetNS(ns)
	a.WaitStarted()
	deadline := time.Now().Add(5 * time.Second)
	if node.connect(node.peerNS(), podA, 80) {
		t.Error("audit mode off: the deny-all pod is reached")
	}
	if node.udp(node.podNS("a"), policyPeerIP, 53) {
		t.Error("audit mode off: the deny-all pod reaches its peer")
	}
	if time.Now().After(deadline) {
		t.Error("audit mode off: the probes took over 5 s")
	}
}
