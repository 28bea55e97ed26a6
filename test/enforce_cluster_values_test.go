package test

import (
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/enimasq/enimasq/cells/celltest"
)

// 30 port entries in one rule: an Admin Accept of 30 TCP ports (9001,
// 9003, ..., 9059) to the peer for a pod whose PolicyEndpoint denies all
// its egress. Exactly those ports are allowed: the first, the last and the
// others listed pass, a port between them that is not listed does not
// (traffic on some, the verdict program on every port of 9000-9060).
func TestPrivilegedClusterThirtyPorts(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA})
	var listed []string
	isListed := map[int]bool{}
	for i := range 30 {
		port := 9001 + 2*i
		listed = append(listed, fmt.Sprintf("TCP %d", port))
		isListed[port] = true
	}
	if err := celltest.InNS(n.ns[n.peerNS()], func() error {
		for port := 9000; port <= 9060; port++ {
			if err := answerOK(t, "tcp4", net.JoinHostPort(policyPeerIP, strconv.Itoa(port))); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	n.start(map[string]string{
		"a":   policyEndpoint("a", podA, []string{"Egress"}, nil, nil),
		"cpe": clusterPolicyEndpoint("ports", "Admin", 1, []string{podA}, nil, []cpeRule{{cidr: policyPeerIP + "/32", ports: listed, action: "Accept"}}),
	})
	// Traffic: the first, the last, one between not listed, and around.
	n.expect(t,
		cprobe{"a", "egress", "tcp", policyPeerIP, 9001, true, "admin ClusterPolicyEndpoint/ports"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 9059, true, "admin ClusterPolicyEndpoint/ports"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 9030, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 9031, true, "admin ClusterPolicyEndpoint/ports"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 9000, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "tcp", policyPeerIP, 9060, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "egress", "udp", policyPeerIP, 53, false, "namespace PolicyEndpoint/e2e/a"},
	)
	// The verdict program on every port around the list, and traffic on
	// every listed one.
	for port := 9000; port <= 9060; port++ {
		p := cprobe{"a", "egress", "tcp", policyPeerIP, port, isListed[port], "namespace PolicyEndpoint/e2e/a"}
		if p.allow {
			p.decider = "admin ClusterPolicyEndpoint/ports"
			if !n.try(p) {
				t.Errorf("%s: listed, but the connection failed", p)
			}
		}
		if v := n.verdict(p); !p.verdictAgrees(v) {
			t.Errorf("%s: the verdict program says %q, want %s by %q", p, v, allowText(p.allow), p.decider)
		}
	}
}

// Two peers whose Admin values agree on their first eight intervals (as
// many as a row's text shows) keep their own values: every peer is denied
// eight TCP ports, 10.0.1.2 is accepted UDP 53 and 10.0.1.3 denied it, for
// a pod whose PolicyEndpoint isolates its ingress. UDP 53 from 10.0.1.3
// must not pass (it did before 676a388: the compiler interned cluster
// values by their text, which is cut after eight intervals, and 10.0.1.3
// got 10.0.1.2's value).
func TestPrivilegedClusterDenyNotTakenFromAnotherPeer(t *testing.T) {
	n := newClusterNode(t, map[string]string{"a": podA})
	var eight []string
	for port := 1; port <= 15; port += 2 {
		eight = append(eight, fmt.Sprintf("TCP %d", port))
	}
	n.start(map[string]string{
		"a": policyEndpoint("a", podA, []string{"Ingress"}, nil, nil),
		"cpe": clusterPolicyEndpoint("peers", "Admin", 2, []string{podA}, []cpeRule{
			{cidr: "0.0.0.0/0", ports: eight, action: "Deny"},
			{cidr: policyPeerIP + "/32", ports: []string{"UDP 53"}, action: "Accept"},
			{cidr: peerC2 + "/32", ports: []string{"UDP 53"}, action: "Deny"},
		}, nil),
	})
	n.expect(t,
		cprobe{"a", "ingress", "udp", policyPeerIP, 53, true, "admin ClusterPolicyEndpoint/peers"},
		cprobe{"a", "ingress", "udp", peerC2, 53, false, "admin ClusterPolicyEndpoint/peers"},
		cprobe{"a", "ingress", "udp", peerC3, 53, false, "namespace PolicyEndpoint/e2e/a"},
		cprobe{"a", "ingress", "tcp", peerC2, 80, false, "namespace PolicyEndpoint/e2e/a"},
	)
}
