package test

import (
	"path/filepath"
	"strings"
	"testing"
)

// badPolicyEndpoint selects pod for egress with a cidr that is no CIDR: the
// object is not valid.
func badPolicyEndpoint(name, pod string) string {
	return strings.Replace(policyEndpoint(name, pod, []string{"Egress"}, nil, []peRule{{cidr: "0.0.0.0/0"}}),
		`cidr: "0.0.0.0/0"`, `cidr: "0.0.0.0/33"`, 1)
}

// v150PolicyEndpoint is what the AWS controller v1.5.0 writes for an egress
// policy with an FQDN peer and an ipBlock: an entry with domainName and no
// cidr, then the cidr entries.
func v150PolicyEndpoint(name, pod string, cidr, port string) string {
	pe := policyEndpoint(name, pod, []string{"Egress"}, nil, []peRule{{cidr: cidr, ports: []string{"TCP " + port}}})
	return strings.Replace(pe, "  egress:\n", "  egress:\n  - domainName: \"*.example.com\"\n    ports:\n    - {protocol: TCP, port: 443}\n", 1)
}

// startDegradedAgent is startAgent for a directory that holds an invalid
// file: the agent answers /healthz, Degraded, instead of healthy.
func (n *policyNode) startDegradedAgent(pes map[string]string) (*Agent, string) {
	n.t.Helper()
	return n.launchAgent(pes)
}

// TestPrivilegedNetworkPolicyFailsClosed: the agent starts on a good
// PolicyEndpoint file (pod A: ingress from the peer on TCP 80 only) and an
// invalid one (pod B, Egress, a cidr that is no CIDR). The good one is
// enforced as traffic, and pod B is isolated in the direction its object
// names (egress denied, ingress open) while health is Degraded naming the
// file, the field and the value. Then pod B's object as the AWS controller
// v1.5.0 writes it (a domainName entry without a cidr, a cidr entry) is
// enforced for its cidr entry, and health recovers.
func TestPrivilegedNetworkPolicyFailsClosed(t *testing.T) {
	node := newPolicyNode(t)
	node.addPod("a", "enimfc0a", podA)
	node.addPod("b", "enimfc0b", podB)

	a, dir := node.startDegradedAgent(map[string]string{
		"a": policyEndpoint("a", podA, []string{"Ingress"}, []peRule{{cidr: policyPeerIP + "/32", ports: []string{"TCP 80"}}}, nil),
		"b": badPolicyEndpoint("b", podB),
	})
	a.WaitFor("health Degraded naming b.yaml, its field and value", func() bool {
		_, body, err := a.Get("/healthz")
		return err == nil && strings.Contains(string(body), "b.yaml: e2e/b: field spec.egress[0].cidr: value \\\"0.0.0.0/33\\\" is not a CIDR")
	})
	waitAttached(a, 2)

	for _, c := range []struct {
		what     string
		from, to string
		port     int
		allow    bool
	}{
		{"peer -> A tcp/80 (A's good policy allows it)", node.peerNS(), podA, 80, true},
		{"peer -> A tcp/81 (A's good policy denies it)", node.peerNS(), podA, 81, false},
		{"B -> peer tcp/80 (B's unreadable object isolates its egress)", node.podNS("b"), policyPeerIP, 80, false},
		{"B -> peer tcp/443 (B's unreadable object isolates its egress)", node.podNS("b"), policyPeerIP, 443, false},
		{"peer -> B tcp/80 (B's object names no ingress isolation)", node.peerNS(), podB, 80, true},
	} {
		if got := node.connect(c.from, c.to, c.port); got != c.allow {
			t.Errorf("%s: passed=%t, want %t", c.what, got, c.allow)
		}
	}
	show := a.MustDbg("shell", "--", "db/show", "policy-endpoints")
	if !strings.Contains(show, "not valid and no last good version") {
		t.Errorf("pod B's row does not say it is a stand-in:\n%s", show)
	}

	// The controller v1.5.0's object for pod B: its cidr entry is enforced,
	// its domainName entry allows nothing.
	WriteFileAtomic(t, filepath.Join(dir, "b.yaml"), v150PolicyEndpoint("b", podB, policyPeerIP+"/32", "80"))
	a.WaitHealthy()
	a.WaitFor("B -> peer tcp/80 allowed by the v1.5.0 object's cidr entry", func() bool {
		return node.connect(node.podNS("b"), policyPeerIP, 80)
	})
	for _, c := range []struct {
		what     string
		from, to string
		port     int
		allow    bool
	}{
		{"B -> peer tcp/443 (only the domainName entry names it: nothing allowed)", node.podNS("b"), policyPeerIP, 443, false},
		{"B -> peer tcp/81 (no entry allows it)", node.podNS("b"), policyPeerIP, 81, false},
		{"peer -> B tcp/80 (no ingress isolation)", node.peerNS(), podB, 80, true},
		{"peer -> A tcp/80 (A's policy still enforced)", node.peerNS(), podA, 80, true},
		{"peer -> A tcp/81 (A's policy still enforced)", node.peerNS(), podA, 81, false},
	} {
		if got := node.connect(c.from, c.to, c.port); got != c.allow {
			t.Errorf("%s: passed=%t, want %t", c.what, got, c.allow)
		}
	}
	show = a.MustDbg("shell", "--", "db/show", "policy-endpoints")
	if !strings.Contains(show, "1 rules, 1 names") {
		t.Errorf("pod B's row does not hold its domainName entry as a name rule:\n%s", show)
	}
}
