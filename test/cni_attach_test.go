package test

// enimasq-cni's attachments (CNI_CONTAINERID + CNI_IFNAME) as a runtime
// drives them through libcni: DEL, GC, CHECK and STATUS.

import (
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// wantAttachment fails unless the live attachment has its IP at the agent,
// its rules, its host veth and host route, and passes CHECK.
func wantAttachment(t *testing.T, topo *vpcTopology, api *apiClient, cni *libCNI, containerID, ip string, pod podRef, podNS string) {
	t.Helper()
	rows := api.list(t, "?containerID="+containerID+"&ifname=eth0")
	if len(rows) != 1 || rows[0].IP != ip || rows[0].Owner != pod.Namespace+"/"+pod.Name || rows[0].PodUID != pod.UID {
		t.Errorf("%s: the agent holds %+v, want %s for %s/%s (uid %s)", containerID, rows, ip, pod.Namespace, pod.Name, pod.UID)
	}
	if len(topo.nodeRules(ip)) == 0 {
		t.Errorf("%s: no rules of %s", containerID, ip)
	}
	if via := topo.hostRoutes()[ip]; via != hostVethName(containerID, "eth0") {
		t.Errorf("%s: route to %s via %q, want %s", containerID, ip, via, hostVethName(containerID, "eth0"))
	}
	if err := cni.check(runtimeConf(containerID, "eth0", podNS, pod)); err != nil {
		t.Errorf("%s: CHECK: %v", containerID, err)
	}
}

// wantGone fails if anything of a deleted attachment is left on the node.
// The agent removes the rules after it answers the release: they are
// waited for.
func wantGone(t *testing.T, a *Agent, topo *vpcTopology, api *apiClient, containerID, ip string) {
	t.Helper()
	if rows := api.list(t, "?containerID="+containerID+"&ifname=eth0"); len(rows) != 0 {
		t.Errorf("%s: the agent still holds %+v", containerID, rows)
	}
	a.WaitFor("rules of "+ip+" removed", func() bool { return len(topo.nodeRules(ip)) == 0 })
	if slices.Contains(topo.links("lxc"), hostVethName(containerID, "eth0")) {
		t.Errorf("%s: host veth %s left", containerID, hostVethName(containerID, "eth0"))
	}
	if via, ok := topo.hostRoutes()[ip]; ok {
		t.Errorf("%s: route to %s via %s left", containerID, ip, via)
	}
}

// The sequence: a StatefulSet pod's new sandbox (B) is added before
// the old one's (A) DEL. A's DEL releases only A's IP: B keeps its IP, rules
// and veth, and no later pod gets B's IP.
func TestPrivilegedCNIAttachStaleDELKeepsTheNewSandbox(t *testing.T) {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, sample(t, "ciliumnode.yaml"), sample(t, "ip-masq-agent.yaml"))
	cni, pods, api := newLibCNI(t, topo, a.APISocket()), newCNIRuntime(t, topo, a.APISocket()), newAPIClient(a.APISocket())

	podA := podRef{"shop", "db-0", "0b5d6f3e-0000-4000-8000-00000000000a"}
	podB := podRef{"shop", "db-0", "0b5d6f3e-0000-4000-8000-00000000000b"}
	nsA, nsB := pods.newPod("db0-a"), pods.newPod("db0-b")
	rtA, rtB := runtimeConf("sandbox-a", "eth0", nsA, podA), runtimeConf("sandbox-b", "eth0", nsB, podB)
	ipA := cni.mustAdd(rtA)
	ipB := cni.mustAdd(rtB)
	if ipA == ipB {
		t.Fatalf("two sandboxes of shop/db-0 share %s", ipA)
	}

	cni.mustDel(rtA)
	wantGone(t, a, topo, api, "sandbox-a", ipA)
	wantAttachment(t, topo, api, cni, "sandbox-b", ipB, podB, nsB)

	// A's DEL again, and a DEL of an attachment never added (same pod):
	// nothing is touched.
	cni.mustDel(rtA)
	cni.mustDel(runtimeConf("never-added", "eth0", "", podA))
	wantAttachment(t, topo, api, cni, "sandbox-b", ipB, podB, nsB)

	// The next pods, until the pool is exhausted, never get B's IP.
	nsC := pods.newPod("db1")
	if ipC := cni.mustAdd(runtimeConf("sandbox-c", "eth0", nsC, podRef{"shop", "db-1", ""})); ipC == ipB {
		t.Fatalf("the next pod got B's %s", ipB)
	}
	for i := 0; ; i++ {
		var res struct{ IP string }
		code, body, err := api.do(http.MethodPost, "/v1/ipam", map[string]string{"owner": fmt.Sprintf("shop/filler-%d", i)}, &res)
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusServiceUnavailable && strings.Contains(string(body), "pool-exhausted") {
			break
		}
		if code != http.StatusCreated || res.IP == ipB {
			t.Fatalf("allocation %d: %d %s (B holds %s)", i, code, body, ipB)
		}
	}
	wantAttachment(t, topo, api, cni, "sandbox-b", ipB, podB, nsB)
	cni.mustDel(rtB)
	wantGone(t, a, topo, api, "sandbox-b", ipB)
}

// GC (CNI 1.1) with 3 valid attachments out of 10: the 7 others are
// released, their rules, veths and host routes removed; the 3 and an
// allocation made through the API stay. cnitool's gc (no valid
// attachments) then releases the 3.
func TestPrivilegedCNIAttachGCReleasesTheAttachmentsNotValid(t *testing.T) {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, poolCiliumNode(t, 12), sample(t, "ip-masq-agent.yaml"))
	cni, pods, api := newLibCNI(t, topo, a.APISocket()), newCNIRuntime(t, topo, a.APISocket()), newAPIClient(a.APISocket())

	var apiIP struct{ IP string }
	if code, body, err := api.do(http.MethodPost, "/v1/ipam", map[string]string{"owner": "kube-system/api-client"}, &apiIP); err != nil || code != http.StatusCreated {
		t.Fatalf("API allocation: %d %v %s", code, err, body)
	}

	const n = 10
	ips, nss := make([]string, n), make([]string, n)
	ref := func(i int) podRef { return podRef{"shop", fmt.Sprintf("web-%d", i), ""} }
	id := func(i int) string { return fmt.Sprintf("gc-%d", i) }
	for i := range n {
		nss[i] = pods.newPod(fmt.Sprintf("gc%d", i))
		ips[i] = cni.mustAdd(runtimeConf(id(i), "eth0", nss[i], ref(i)))
	}
	keep := []int{0, 4, 7}
	var valid []types.GCAttachment
	for _, i := range keep {
		valid = append(valid, types.GCAttachment{ContainerID: id(i), IfName: "eth0"})
	}
	// Without libcni's cache, only the plugin's GC runs (no DEL first).
	if err := cni.withoutCache().gc(valid); err != nil {
		t.Fatalf("GC: %v", err)
	}
	for i := range n {
		if slices.Contains(keep, i) {
			wantAttachment(t, topo, api, cni, id(i), ips[i], ref(i), nss[i])
		} else {
			wantGone(t, a, topo, api, id(i), ips[i])
		}
	}
	rows := api.list(t, "")
	if len(rows) != len(keep)+1 || !slices.ContainsFunc(rows, func(r allocationRow) bool { return r.IP == apiIP.IP }) {
		t.Errorf("after GC the agent holds %+v, want the 3 valid attachments and the API's %s", rows, apiIP.IP)
	}
	if links := topo.links("lxc"); len(links) != len(keep) {
		t.Errorf("host veths after GC: %v", links)
	}

	// The same GC through libcni with its cache: the stale attachments get
	// a DEL (they hold nothing now), then the GC releases nothing more.
	if err := cni.gc(valid); err != nil {
		t.Fatalf("GC with the cache: %v", err)
	}
	for _, i := range keep {
		wantAttachment(t, topo, api, cni, id(i), ips[i], ref(i), nss[i])
	}

	// cnitool gc passes no valid attachment: every attachment goes, the
	// API's allocation stays.
	if out, err := pods.cnitool("gc", nss[0], "web-0"); err != nil {
		t.Fatalf("cnitool gc: %v\n%s", err, out)
	}
	for _, i := range keep {
		wantGone(t, a, topo, api, id(i), ips[i])
	}
	if rows := api.list(t, ""); len(rows) != 1 || rows[0].IP != apiIP.IP {
		t.Errorf("after cnitool gc the agent holds %+v, want only the API's %s", rows, apiIP.IP)
	}
}

// STATUS (CNI 1.1): OK with the agent up; code 50 ("plugin not available")
// with it down. The plugin advertises 1.1.0.
func TestPrivilegedCNIAttachStatus(t *testing.T) {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, sample(t, "ciliumnode.yaml"), sample(t, "ip-masq-agent.yaml"))
	cni, pods := newLibCNI(t, topo, a.APISocket()), newCNIRuntime(t, topo, a.APISocket())

	info, err := cni.cni.GetVersionInfo(t.Context(), "enimasq-cni")
	if err != nil || !slices.Contains(info.SupportedVersions(), "1.1.0") {
		t.Fatalf("VERSION: %v %v, want 1.1.0 supported", info, err)
	}
	if err := cni.status(); err != nil {
		t.Errorf("STATUS with the agent up: %v", err)
	}
	if out, err := pods.cnitool("status", topo.Node, "x"); err != nil {
		t.Errorf("cnitool status: %v\n%s", err, out)
	}
	a.Kill9()
	err = cni.status()
	if code := cniErrorCode(err); code != 50 || !strings.Contains(err.Error(), "not running") {
		t.Errorf("STATUS with the agent down: %v (code %d), want code 50", err, code)
	}
	if out, err := pods.cnitool("status", topo.Node, "x"); err == nil {
		t.Errorf("cnitool status with the agent down succeeded:\n%s", out)
	}
}

// CHECK fails when what ADD made is gone: the host veth deleted behind
// the plugin's back, or the IP released through the API.
func TestPrivilegedCNIAttachCheck(t *testing.T) {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, sample(t, "ciliumnode.yaml"), sample(t, "ip-masq-agent.yaml"))
	cni, pods, api := newLibCNI(t, topo, a.APISocket()), newCNIRuntime(t, topo, a.APISocket()), newAPIClient(a.APISocket())

	web, db := podRef{"shop", "web", ""}, podRef{"shop", "db", ""}
	nsWeb, nsDB := pods.newPod("web"), pods.newPod("db")
	rtWeb, rtDB := runtimeConf("check-web", "eth0", nsWeb, web), runtimeConf("check-db", "eth0", nsDB, db)
	cni.mustAdd(rtWeb)
	dbIP := cni.mustAdd(rtDB)
	if err := cni.check(rtWeb); err != nil {
		t.Fatalf("CHECK of live web: %v", err)
	}
	if err := cni.check(rtDB); err != nil {
		t.Fatalf("CHECK of live db: %v", err)
	}

	run(t, "ip", "-n", topo.Node, "link", "del", hostVethName("check-web", "eth0"))
	if err := cni.check(rtWeb); err == nil || !strings.Contains(err.Error(), hostVethName("check-web", "eth0")) {
		t.Errorf("CHECK with the host veth deleted: %v, want an error naming it", err)
	}

	if code, body, err := api.do(http.MethodDelete, "/v1/ipam/"+dbIP, nil, nil); err != nil || code != http.StatusOK {
		t.Fatalf("DELETE %s: %d %v %s", dbIP, code, err, body)
	}
	if err := cni.check(rtDB); err == nil || !strings.Contains(err.Error(), "no allocation of "+dbIP) {
		t.Errorf("CHECK with the IP released: %v, want no allocation", err)
	}
	cni.mustDel(rtWeb)
	cni.mustDel(rtDB)
}

// Allocations of a version-1 checkpoint have no attachment: a DEL whose
// attachment holds nothing releases the pod's, unless the node still
// routes the IP to a veth (a live sandbox of the pod).
func TestPrivilegedCNIAttachDELOfVersion1Allocations(t *testing.T) {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, sample(t, "ciliumnode.yaml"), sample(t, "ip-masq-agent.yaml"), func(a *Agent) {
		WriteFileAtomic(t, filepath.Join(a.StateDir, "ipam-allocations.json"), `{"version": 1, "allocations": [
  {"ip": "10.130.100.133", "owner": "shop/db-0"},
  {"ip": "10.130.100.134", "owner": "shop/web-0"},
  {"ip": "10.130.112.20", "owner": "cni/Legacy_Container"}
]}`)
	})
	cni, api := newLibCNI(t, topo, a.APISocket()), newAPIClient(a.APISocket())
	a.WaitFor("version-1 allocations restored", func() bool { return len(api.list(t, "")) == 3 })

	// shop/web-0's old sandbox still runs: its veth routes the IP.
	veth := hostVethName("old-web", "eth0")
	run(t, "ip", "-n", topo.Node, "link", "add", veth, "type", "veth", "peer", "name", "peer-web")
	run(t, "ip", "-n", topo.Node, "link", "set", veth, "up")
	run(t, "ip", "-n", topo.Node, "route", "add", "10.130.100.134/32", "dev", veth)

	cni.mustDel(runtimeConf("old-db", "eth0", "", podRef{"shop", "db-0", ""}))
	cni.mustDel(runtimeConf("new-web", "eth0", "", podRef{"shop", "web-0", ""}))
	// Without Kubernetes names, the owner was "cni/<container ID>".
	rt := runtimeConf("Legacy_Container", "eth0", "", podRef{})
	rt.Args = nil
	cni.mustDel(rt)

	held := map[string]string{}
	for _, r := range api.list(t, "") {
		held[r.IP] = r.Owner
	}
	if want := map[string]string{"10.130.100.134": "shop/web-0"}; !maps.Equal(held, want) {
		t.Fatalf("after the DELs the agent holds %v, want %v", held, want)
	}
	a.WaitFor("rules of the released IPs removed", func() bool {
		return len(topo.nodeRules("10.130.100.133")) == 0 && len(topo.nodeRules("10.130.112.20")) == 0
	})
	if len(topo.nodeRules("10.130.100.134")) == 0 {
		t.Errorf("the live version-1 sandbox lost its rules")
	}
}

// One container with two interfaces is two attachments: ADD eth0 and ADD
// eth1 both work, each with its own IP, host veth and rules. The DEL of
// eth1 leaves eth0 whole: its veth, its address in the pod, its rules, its
// allocation, and CHECK passes.
func TestPrivilegedCNIAttachTwoInterfacesOfOneContainer(t *testing.T) {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, sample(t, "ciliumnode.yaml"), sample(t, "ip-masq-agent.yaml"))
	cni, pods, api := newLibCNI(t, topo, a.APISocket()), newCNIRuntime(t, topo, a.APISocket()), newAPIClient(a.APISocket())

	pod := podRef{"shop", "multi", "0b5d6f3e-0000-4000-8000-0000000000c1"}
	podNS := pods.newPod("multi")
	rt0, rt1 := runtimeConf("ctr1", "eth0", podNS, pod), runtimeConf("ctr1", "eth1", podNS, pod)
	ip0 := cni.mustAdd(rt0)
	ip1 := cni.mustAdd(rt1)
	if ip0 == ip1 {
		t.Fatalf("eth0 and eth1 of ctr1 share %s", ip0)
	}
	if via := topo.hostRoutes()[ip1]; via != hostVethName("ctr1", "eth1") {
		t.Errorf("route to eth1's %s via %q, want its own veth %s", ip1, via, hostVethName("ctr1", "eth1"))
	}
	if err := cni.check(rt1); err != nil {
		t.Errorf("CHECK of eth1: %v", err)
	}

	cni.mustDel(rt1)
	wantAttachment(t, topo, api, cni, "ctr1", ip0, pod, podNS)
	if addrs := run(t, "ip", "-n", podNS, "-o", "addr", "show", "dev", "eth0"); !strings.Contains(addrs, ip0+"/32") {
		t.Errorf("eth0 lost its address %s:\n%s", ip0, addrs)
	}
	if rows := api.list(t, "?containerID=ctr1&ifname=eth1"); len(rows) != 0 {
		t.Errorf("eth1's allocation left: %+v", rows)
	}
	a.WaitFor("rules of eth1's "+ip1+" removed", func() bool { return len(topo.nodeRules(ip1)) == 0 })
	if slices.Contains(topo.links("lxc"), hostVethName("ctr1", "eth1")) {
		t.Errorf("eth1's host veth left")
	}
}

// Two networks on one agent: a GC is of its network. The GC of "enimasq"
// that keeps only A releases nothing of "netb"'s B (its IP, veth and
// rules stay); netb's own GC releases B and leaves A.
func TestPrivilegedCNIAttachGCIsOfItsNetwork(t *testing.T) {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, sample(t, "ciliumnode.yaml"), sample(t, "ip-masq-agent.yaml"))
	netA, netB := newLibCNI(t, topo, a.APISocket()), newLibCNINetwork(t, topo, a.APISocket(), "netb")
	pods, api := newCNIRuntime(t, topo, a.APISocket()), newAPIClient(a.APISocket())

	podA, podB := podRef{"shop", "a", ""}, podRef{"shop", "b", ""}
	nsA, nsB := pods.newPod("a"), pods.newPod("b")
	ipA := netA.mustAdd(runtimeConf("sandbox-a", "eth0", nsA, podA))
	ipB := netB.mustAdd(runtimeConf("sandbox-b", "eth0", nsB, podB))

	if err := netA.withoutCache().gc([]types.GCAttachment{{ContainerID: "sandbox-a", IfName: "eth0"}}); err != nil {
		t.Fatalf("GC of enimasq: %v", err)
	}
	wantAttachment(t, topo, api, netA, "sandbox-a", ipA, podA, nsA)
	wantAttachment(t, topo, api, netB, "sandbox-b", ipB, podB, nsB)

	if err := netB.withoutCache().gc(nil); err != nil {
		t.Fatalf("GC of netb: %v", err)
	}
	wantGone(t, a, topo, api, "sandbox-b", ipB)
	wantAttachment(t, topo, api, netA, "sandbox-a", ipA, podA, nsA)
}

// STATUS says whether an ADD would work for the agent's state: it fails
// (50) while the agent has no CiliumNode, when an ADD fails too; it
// succeeds once it has one, and still with an invalid ip-masq-agent file
// (the last good CIDRs in force, ADDs work); with the pool exhausted it
// fails with 51 ("cannot allocate new IP addresses").
func TestPrivilegedCNIAttachStatusSaysWhetherAnADDWorks(t *testing.T) {
	requireIPAM(t)
	topo := newVPCTopology(t)
	a := NewAgent(t)
	a.NetNSName = topo.Node
	configPath := filepath.Join(a.Dir, "config", "ip-masq-agent")
	nodePath := filepath.Join(a.Dir, "node", "ciliumnode.yaml")
	WriteFileAtomic(t, configPath, sample(t, "ip-masq-agent.yaml"))
	a.Args = append(a.Args, "--enable-ip-masq-agent", "--enable-bpf-masquerade", "--ip-masq-agent-config-path", configPath,
		"--ciliumnode-path", nodePath, "--ciliumnode-resync-interval=100ms")
	a.Start()
	a.WaitHealthy()
	cni, pods, api := newLibCNI(t, topo, a.APISocket()), newCNIRuntime(t, topo, a.APISocket()), newAPIClient(a.APISocket())
	web := podRef{"shop", "web", ""}
	nsWeb := pods.newPod("web")

	if err := cni.status(); cniErrorCode(err) != 50 || !strings.Contains(err.Error(), "no CiliumNode") {
		t.Errorf("STATUS without a CiliumNode: %v (code %d), want 50 naming the CiliumNode", err, cniErrorCode(err))
	}
	if _, err := cni.add(runtimeConf("status-web", "eth0", nsWeb, web)); cniErrorCode(err) != 11 {
		t.Errorf("ADD without a CiliumNode: %v (code %d), want 11 (try again later)", err, cniErrorCode(err))
	}

	WriteFileAtomic(t, nodePath, sample(t, "ciliumnode.yaml"))
	a.WaitFor("STATUS OK with the CiliumNode", func() bool { return cni.status() == nil })
	cni.mustAdd(runtimeConf("status-web", "eth0", nsWeb, web))

	WriteFileAtomic(t, configPath, "nonMasqueradeCIDRs: [10.0.0.0/33]\n")
	a.WaitFor("the invalid ip-masq-agent file reported", func() bool {
		out, _, _ := a.Dbg("health")
		return strings.Contains(out, "ipmasq") && strings.Contains(out, "Degraded")
	})
	if err := cni.status(); err != nil {
		t.Errorf("STATUS with an invalid ip-masq-agent file (the last good one in force): %v", err)
	}
	db := podRef{"shop", "db", ""}
	cni.mustAdd(runtimeConf("status-db", "eth0", pods.newPod("db"), db))

	// The rest of the pool through the API, then STATUS says no IP is left.
	for i := 0; ; i++ {
		code, body, err := api.do(http.MethodPost, "/v1/ipam", map[string]string{"owner": fmt.Sprintf("shop/fill-%d", i)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusServiceUnavailable && strings.Contains(string(body), "pool-exhausted") {
			break
		}
		if code != http.StatusCreated || i > 100 {
			t.Fatalf("filling the pool: %d %s", code, body)
		}
	}
	if err := cni.status(); cniErrorCode(err) != 51 {
		t.Errorf("STATUS with the pool exhausted: %v (code %d), want 51", err, cniErrorCode(err))
	}
}

// A DEL of an attachment never added touches nothing, also when the pod's
// name owns an allocation made through the agent API: only allocations of
// a version-1 checkpoint (the CNI's, from before attachments) are released
// by their pod's DEL.
func TestPrivilegedCNIAttachDELOfNeverAddedKeepsAPIAllocations(t *testing.T) {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, sample(t, "ciliumnode.yaml"), sample(t, "ip-masq-agent.yaml"))
	cni, api := newLibCNI(t, topo, a.APISocket()), newAPIClient(a.APISocket())
	code, body, err := api.do(http.MethodPost, "/v1/ipam", map[string]string{"owner": "shop/web"}, nil)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("API allocation for shop/web: %d %s %v", code, body, err)
	}
	cni.mustDel(runtimeConf("never-added", "eth0", "", podRef{"shop", "web", ""}))
	if rows := api.list(t, ""); len(rows) != 1 || rows[0].Owner != "shop/web" {
		t.Errorf("after the DEL of a never-added attachment of shop/web the agent holds %+v, want the API's allocation", rows)
	}
}

// Attachments of a version-2 checkpoint recorded no network: a retried ADD
// in a network takes its allocation over (the same IP, now of that
// network), and a DEL in a network releases one that was never taken over.
func TestPrivilegedCNIAttachVersion2AttachmentsJoinTheirNetwork(t *testing.T) {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, sample(t, "ciliumnode.yaml"), sample(t, "ip-masq-agent.yaml"), func(a *Agent) {
		WriteFileAtomic(t, filepath.Join(a.StateDir, "ipam-allocations.json"), `{"version": 2, "allocations": [
  {"ip": "10.130.100.133", "owner": "shop/web", "containerID": "v2-web", "ifname": "eth0"},
  {"ip": "10.130.100.134", "owner": "shop/db", "containerID": "v2-db", "ifname": "eth0"}
]}`)
	})
	cni, api := newLibCNI(t, topo, a.APISocket()), newAPIClient(a.APISocket())
	a.WaitFor("version-2 allocations restored", func() bool { return len(api.list(t, "")) == 2 })

	var res struct{ IP string }
	code, body, err := api.do(http.MethodPost, "/v1/ipam", map[string]string{
		"owner": "shop/web", "network": "enimasq", "containerID": "v2-web", "ifname": "eth0"}, &res)
	if err != nil || code != http.StatusOK || res.IP != "10.130.100.133" {
		t.Fatalf("ADD again of v2-web: %d %s %v, want 200 and its 10.130.100.133", code, body, err)
	}
	if rows := api.list(t, "?network=enimasq&containerID=v2-web&ifname=eth0"); len(rows) != 1 || rows[0].Network != "enimasq" {
		t.Errorf("v2-web after the ADD: %+v, want its allocation in network enimasq", rows)
	}

	cni.mustDel(runtimeConf("v2-db", "eth0", "", podRef{"shop", "db", ""}))
	if rows := api.list(t, ""); len(rows) != 1 || rows[0].IP != "10.130.100.133" {
		t.Errorf("after the DEL of v2-db the agent holds %+v, want only v2-web's", rows)
	}
}
