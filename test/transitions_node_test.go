package test

import (
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/cells/celltest"
)

// transitionNode is a policy node whose peer also answers on trDenied,
// trPeer2 and trPeer3 (the node routes 10.0.2.0/24 and 10.0.3.0/24 to
// it), with a counter of the UDP datagrams that reach trPort of each.
type transitionNode struct {
	*policyNode
	agent    *Agent
	dir      string
	counters map[string]*trCounter // peer address -> datagrams to trPort
	controls *trCounter            // datagrams to trPeer3:trControlPort
}

func newTransitionNode(t *testing.T) *transitionNode {
	t.Helper()
	n := &transitionNode{policyNode: newPolicyNode(t), counters: map[string]*trCounter{}}
	peer := n.peerNS()
	for _, ip := range []string{trDenied, trPeer2, trPeer3} {
		run(t, "ip", "-n", peer, "addr", "add", ip+"/24", "dev", "eth0")
		n.serve(peer, ip)
		n.counters[ip] = n.countFlows(peer, ip, trPort)
	}
	n.controls = n.countFlows(peer, trPeer3, trControlPort)
	for _, cidr := range []string{"10.0.2.0/24", "10.0.3.0/24"} {
		run(t, "ip", "-n", n.Node, "route", "add", cidr, "via", policyPeerIP, "dev", "peer0")
	}
	// The node's neighbours of the peer are permanent: a frame the
	// programs pass is never lost waiting for ARP, so it is counted.
	var mac string
	if err := celltest.InNS(n.ns[peer], func() error {
		ifc, err := net.InterfaceByName("eth0")
		if err == nil {
			mac = ifc.HardwareAddr.String()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{policyPeerIP, trDenied} {
		run(t, "ip", "-n", n.Node, "neigh", "replace", ip, "lladdr", mac, "dev", "peer0", "nud", "permanent")
	}
	return n
}

// start starts the agent on the files and waits until that many pod
// devices carry the programs.
func (n *transitionNode) start(files map[string]string, pods int, extra ...string) {
	n.t.Helper()
	n.agent, n.dir = n.startAgent(files, extra...)
	waitAttached(n.agent, pods)
	n.t.Cleanup(func() {
		if n.t.Failed() {
			n.diagnose()
		}
	})
}

// write replaces (or adds) a file of the policy-endpoints directory, by a
// temporary file renamed over it.
func (n *transitionNode) write(name, content string) {
	n.t.Helper()
	WriteFileAtomic(n.t, filepath.Join(n.dir, name+".yaml"), content)
}

// diagnose logs what the agent and the kernel hold: the versions, the
// entries, the keys, health.
func (n *transitionNode) diagnose() {
	for _, args := range [][]string{
		{"shell", "--", "db/show", "policy-versions"},
		{"shell", "--", "db/show", "policy-map-entries"},
		{"shell", "--", "db/show", "cluster-policy-map-entries"},
		{"bpf", "policy", "list"},
	} {
		out, errOut, err := n.agent.Dbg(args...)
		n.t.Logf("enimasq-dbg %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	_, body, err := n.agent.Get("/healthz")
	n.t.Logf("/healthz: %v\n%s", err, body)
}

// tierVersions is a tier's column of a policy-versions row, as statedb
// dump prints it.
type tierVersions struct {
	Active, Prev, Want uint32
	Rows               int
	Failed             string
}

type podVersionsRow struct {
	Pod           string
	NetworkPolicy tierVersions
	Cluster       tierVersions
	Status        struct {
		Kind  string  `json:"kind"`
		Error *string `json:"error"`
	}
}

// versions is the pod's policy-versions row (ok false: none).
func (n *transitionNode) versions(pod string) (podVersionsRow, bool) {
	n.t.Helper()
	for _, r := range n.agent.Rows("policy-versions") {
		b, _ := json.Marshal(r)
		var row podVersionsRow
		if err := json.Unmarshal(b, &row); err != nil {
			n.t.Fatalf("a policy-versions row: %v\n%s", err, b)
		}
		if row.Pod == pod {
			return row, true
		}
	}
	return podVersionsRow{}, false
}

// settled says whether a tier's newest version is in force, the one before
// gone, and the row in the kernel.
func (r podVersionsRow) settled(tier func(podVersionsRow) tierVersions) bool {
	tv := tier(r)
	return tv.Active != 0 && tv.Active == tv.Want && tv.Prev == 0 && tv.Failed == "" && r.Status.Kind == "Done"
}

func networkPolicyTier(r podVersionsRow) tierVersions { return r.NetworkPolicy }
func clusterTier(r podVersionsRow) tierVersions       { return r.Cluster }

// waitNewVersion waits until a version of the pod's tier newer than after
// is in force, settled, and returns it.
func (n *transitionNode) waitNewVersion(what, pod string, tier func(podVersionsRow) tierVersions, after uint32) uint32 {
	n.t.Helper()
	var row podVersionsRow
	n.agent.WaitFor(what, func() bool {
		var ok bool
		row, ok = n.versions(pod)
		return ok && row.settled(tier) && tier(row).Active > after
	})
	return tier(row).Active
}
