package test

// One container's interface in two networks on one agent: the host veth's
// name has no network in it, so network B's DEL (and GC) must leave network
// A's veth alone when B does not hold it.

import (
	"net/http"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
)

// vethID is a host veth's identity: its index and MAC (a veth made again
// under the same name has others).
type vethID struct {
	Index int
	MAC   string
}

// hostVeth returns the node's link called name, or false when there is none.
func (topo *vpcTopology) hostVeth(name string) (vethID, bool) {
	topo.t.Helper()
	h, err := netlink.NewHandleAt(topo.nodeNS)
	if err != nil {
		topo.t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return vethID{}, false
	}
	return vethID{l.Attrs().Index, l.Attrs().HardwareAddr.String()}, true
}

// twoNetworks is network A ("enimasq") holding container "ctr-a"'s eth0
// and network B ("netb") on the same agent.
type twoNetworks struct {
	t          *testing.T
	topo       *vpcTopology
	a          *Agent
	netA, netB *libCNI
	api        *apiClient
	pod        podRef
	podNS      string
	ipA        string
	veth       vethID
}

const twoNetworksCtr = "ctr-a"

func newTwoNetworks(t *testing.T) *twoNetworks {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, sample(t, "ciliumnode.yaml"), sample(t, "ip-masq-agent.yaml"))
	n := &twoNetworks{
		t: t, topo: topo, a: a,
		netA: newLibCNI(t, topo, a.APISocket()), netB: newLibCNINetwork(t, topo, a.APISocket(), "netb"),
		api: newAPIClient(a.APISocket()), pod: podRef{"shop", "web", "0b5d6f3e-0000-4000-8000-0000000000d1"},
	}
	n.podNS = newCNIRuntime(t, topo, a.APISocket()).newPod("web")
	n.ipA = n.netA.mustAdd(n.rt())
	var ok bool
	if n.veth, ok = topo.hostVeth(hostVethName(twoNetworksCtr, "eth0")); !ok {
		t.Fatalf("A's host veth %s not made", hostVethName(twoNetworksCtr, "eth0"))
	}
	return n
}

// rt is the attachment ctr-a/eth0 of the pod, in either network.
func (n *twoNetworks) rt() *libcni.RuntimeConf {
	return runtimeConf(twoNetworksCtr, "eth0", n.podNS, n.pod)
}

// wantA fails unless A's attachment is whole: the same host veth (index and
// MAC), the node's route to A's IP via it, A's address and routes in the
// pod, traffic out by A's ENI, the agent's allocation in network A (and
// nothing in B), its rules, and CHECK.
func (n *twoNetworks) wantA(step string) {
	t := n.t
	t.Helper()
	name := hostVethName(twoNetworksCtr, "eth0")
	if got, ok := n.topo.hostVeth(name); !ok || got != n.veth {
		t.Fatalf("%s: A's host veth %s is %+v (present %v), want %+v", step, name, got, ok, n.veth)
	}
	if via := n.topo.hostRoutes()[n.ipA]; via != name {
		t.Errorf("%s: route to A's %s via %q, want %s", step, n.ipA, via, name)
	}
	if addrs := run(t, "ip", "-n", n.podNS, "-o", "addr", "show", "dev", "eth0"); !strings.Contains(addrs, n.ipA+"/32") {
		t.Errorf("%s: the pod's eth0 lost A's address %s:\n%s", step, n.ipA, addrs)
	}
	if routes := run(t, "ip", "-n", n.podNS, "route"); !strings.Contains(routes, "default via 169.254.1.1 dev eth0") ||
		!strings.Contains(routes, "169.254.1.1 dev eth0") {
		t.Errorf("%s: the pod lost A's routes:\n%s", step, routes)
	}
	const probes = 20
	if delta := n.topo.probe(n.podNS, peeredAddress, probes); delta[1] < probes {
		t.Errorf("%s: %d of %d packets from the pod left by A's ENI 1 (per ENI: %v)", step, delta[1], probes, delta)
	}
	if rows := n.api.list(t, "?network=enimasq&containerID="+twoNetworksCtr+"&ifname=eth0"); len(rows) != 1 || rows[0].IP != n.ipA || rows[0].Network != "enimasq" {
		t.Errorf("%s: the agent holds %+v for A's attachment, want %s in network enimasq", step, rows, n.ipA)
	}
	wantAttachment(t, n.topo, n.api, n.netA, twoNetworksCtr, n.ipA, n.pod, n.podNS)
}

// leakB is an allocation of B's attachment that B's ADD never wired: an
// ADD that allocated and died before it could undo it.
func (n *twoNetworks) leakB() string {
	n.t.Helper()
	var res struct{ IP string }
	code, body, err := n.api.do(http.MethodPost, "/v1/ipam", map[string]string{
		"owner": n.pod.Namespace + "/" + n.pod.Name, "network": "netb", "containerID": twoNetworksCtr, "ifname": "eth0"}, &res)
	if err != nil || code != http.StatusCreated || res.IP == n.ipA {
		n.t.Fatalf("B's allocation through the API: %d %v %s", code, err, body)
	}
	return res.IP
}

// wantBReleased fails unless the agent holds nothing for B's attachment.
func (n *twoNetworks) wantBReleased(step string) {
	n.t.Helper()
	if rows := n.api.list(n.t, "?network=netb&containerID="+twoNetworksCtr+"&ifname=eth0"); len(rows) != 0 {
		n.t.Errorf("%s: the agent holds %+v for B's attachment, want nothing", step, rows)
	}
}

// Network A's ADD of ctr-a/eth0 succeeds; network B's ADD of the same
// container and interface fails (eth0 exists in the pod); the runtime then
// runs B's DEL, as it does after a failed ADD. A's veth, pod address and
// routes, traffic and allocation stay. So they do after B's DEL of an
// allocation B's ADD made and never wired. A's DEL then removes all of A's.
func TestPrivilegedCNINetworksDELOfAFailedADDKeepsTheOtherNetworksVeth(t *testing.T) {
	n := newTwoNetworks(t)
	n.wantA("after A's ADD")

	_, err := n.netB.add(n.rt())
	if err == nil {
		t.Fatalf("B's ADD of %s/eth0, which A holds, succeeded", twoNetworksCtr)
	}
	t.Logf("B's ADD failed as it must: %v", err)
	n.wantBReleased("after B's failed ADD")
	n.wantA("after B's failed ADD")

	n.netB.mustDel(n.rt())
	n.wantA("after B's DEL")
	n.netB.mustDel(n.rt()) // twice is fine
	n.wantA("after B's second DEL")

	// B's attachment holds an IP its ADD never routed: B's DEL releases it,
	// and A's veth, which does not route it, stays.
	ipB := n.leakB()
	n.netB.mustDel(n.rt())
	n.wantBReleased("after B's DEL of its unwired allocation")
	n.a.WaitFor("rules of B's "+ipB+" removed", func() bool { return len(n.topo.nodeRules(ipB)) == 0 })
	n.wantA("after B's DEL of its unwired allocation")

	n.netA.mustDel(n.rt())
	wantGone(t, n.a, n.topo, n.api, twoNetworksCtr, n.ipA)
	if addrs := run(t, "ip", "-n", n.podNS, "-o", "addr", "show"); strings.Contains(addrs, n.ipA+"/") {
		t.Errorf("A's address left in the pod after A's DEL:\n%s", addrs)
	}
}

// B's GC (no valid attachment) releases an allocation of B's attachment
// that B's ADD never wired; A's veth, of the same name, stays: it routes
// A's IP, not B's. A's GC then removes A's veth.
func TestPrivilegedCNINetworksGCKeepsTheOtherNetworksVeth(t *testing.T) {
	n := newTwoNetworks(t)
	ipB := n.leakB()
	if err := n.netB.withoutCache().gc(nil); err != nil {
		t.Fatalf("GC of netb: %v", err)
	}
	n.wantBReleased("after B's GC")
	n.a.WaitFor("rules of B's "+ipB+" removed", func() bool { return len(n.topo.nodeRules(ipB)) == 0 })
	n.wantA("after B's GC")

	if err := n.netA.withoutCache().gc(nil); err != nil {
		t.Fatalf("GC of enimasq: %v", err)
	}
	wantGone(t, n.a, n.topo, n.api, twoNetworksCtr, n.ipA)
}

// With the agent down, nothing says whose the veth is but the runtime's
// prevResult: B's DEL (no prevResult: its ADD failed) leaves A's veth and
// asks to be retried (11); A's DEL removes A's veth (its prevResult names
// it, with its MAC) and asks to be retried for the release, which its DEL
// does once the agent is back.
func TestPrivilegedCNINetworksDELWithoutTheAgentRemovesOnlyWhatItsResultNames(t *testing.T) {
	n := newTwoNetworks(t)
	if _, err := n.netB.add(n.rt()); err == nil {
		t.Fatalf("B's ADD of %s/eth0, which A holds, succeeded", twoNetworksCtr)
	}
	if _, err := n.a.Stop(); err != nil {
		t.Fatal(err)
	}

	err := n.netB.del(n.rt())
	if code := cniErrorCode(err); code != 11 {
		t.Errorf("B's DEL with the agent down: %v (code %d), want 11 (try again later)", err, code)
	}
	name := hostVethName(twoNetworksCtr, "eth0")
	if got, ok := n.topo.hostVeth(name); !ok || got != n.veth {
		t.Fatalf("after B's DEL with the agent down A's host veth %s is %+v (present %v), want %+v", name, got, ok, n.veth)
	}
	if via := n.topo.hostRoutes()[n.ipA]; via != name {
		t.Errorf("after B's DEL with the agent down the route to A's %s is via %q, want %s", n.ipA, via, name)
	}

	err = n.netA.del(n.rt())
	if code := cniErrorCode(err); code != 11 {
		t.Errorf("A's DEL with the agent down: %v (code %d), want 11 (try again later)", err, code)
	}
	if _, ok := n.topo.hostVeth(name); ok {
		t.Errorf("A's DEL with the agent down left A's host veth %s", name)
	}

	n.a.Start()
	n.a.WaitHealthy()
	n.a.WaitFor("the checkpoint restored", func() bool {
		code, _, err := n.api.do(http.MethodGet, "/v1/ipam", nil, nil)
		return err == nil && code == http.StatusOK
	})
	n.wantAHeldByTheAgent()
	n.netB.mustDel(n.rt())
	n.wantAHeldByTheAgent()
	n.netA.mustDel(n.rt())
	wantGone(t, n.a, n.topo, n.api, twoNetworksCtr, n.ipA)
}

// wantAHeldByTheAgent fails unless the agent still holds A's IP for A.
func (n *twoNetworks) wantAHeldByTheAgent() {
	n.t.Helper()
	if rows := n.api.list(n.t, "?network=enimasq&containerID="+twoNetworksCtr+"&ifname=eth0"); len(rows) != 1 || rows[0].IP != n.ipA {
		n.t.Errorf("the agent holds %+v for A's attachment, want %s", rows, n.ipA)
	}
}
