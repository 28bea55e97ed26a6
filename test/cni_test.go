package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// cniAgent starts an agent in the topology's node netns on the given
// CiliumNode and ip-masq-agent config, and returns it with the config path.
// prepare runs before the agent starts (to write a checkpoint, say).
func cniAgent(t *testing.T, topo *vpcTopology, ciliumNode, config string, prepare ...func(*Agent)) (*Agent, string) {
	requireIPAM(t)
	a := NewAgent(t)
	a.NetNSName = topo.Node
	configPath := filepath.Join(a.Dir, "config", "ip-masq-agent")
	nodePath := filepath.Join(a.Dir, "node", "ciliumnode.yaml")
	WriteFileAtomic(t, configPath, config)
	WriteFileAtomic(t, nodePath, ciliumNode)
	a.Args = append(a.Args,
		"--enable-ip-masq-agent", "--enable-bpf-masquerade", "--ip-masq-agent-config-path", configPath,
		"--ciliumnode-path", nodePath, "--eni-netlink-retry-min=20ms", "--eni-netlink-retry-max=200ms")
	for _, f := range prepare {
		f(a)
	}
	a.Start()
	a.WaitHealthy()
	// Healthy is not ready: allocation waits for the CiliumNode, the
	// ip-masq-agent CIDRs and the checkpoint, which a fast test can beat.
	a.WaitFor("the agent ready to allocate", func() bool {
		if len(a.Rows("enis")) == 0 || len(a.Rows("ip-masq-agent-cidrs")) == 0 {
			return false
		}
		_, _, err := a.Dbg("ipam", "list")
		return err == nil
	})
	return a, configPath
}

func sample(t *testing.T, name string) string {
	data, err := os.ReadFile(filepath.Join("testdata", "samples", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// nodeRules are enimasq's ip rules in the node netns that mention ip.
func (topo *vpcTopology) nodeRules(ip string) []string {
	var out []string
	for _, r := range IPRules(topo.t, topo.nodeNS) {
		if strings.Contains(r, ip+" ") || strings.HasSuffix(r, ip) {
			out = append(out, r)
		}
	}
	return out
}

// The property the ENI work is for: un-masqueraded traffic to a
// non-masquerade CIDR (a peered VPC) leaves by the pod's own ENI, and keeps
// following the ip-masq-agent config under the running pod.
func TestPrivilegedCNIPeeredTrafficLeavesByThePodsENI(t *testing.T) {
	topo := newVPCTopology(t)
	config := sample(t, "ip-masq-agent.yaml")
	a, configPath := cniAgent(t, topo, sample(t, "ciliumnode.yaml"), config)
	cni := newCNIRuntime(t, topo, a.APISocket())

	podNS := cni.newPod("web")
	podIP := cni.add(podNS, "web")
	if !strings.HasPrefix(podIP, "10.130.100.") {
		t.Fatalf("pod got %s, want an address of ENI 1 (10.130.100.x)", podIP)
	}
	peeredRule := "111:\tfrom " + podIP + " to 100.64.0.0/10 lookup 11"
	if rules := topo.nodeRules(podIP); !slices.Contains(rules, peeredRule) {
		t.Fatalf("rules of %s lack %q:\n%s", podIP, peeredRule, strings.Join(rules, "\n"))
	}

	const n = 20
	expectVia := func(step string, eni int) {
		t.Helper()
		delta := topo.probe(podNS, peeredAddress, n)
		for other, got := range delta {
			if other == eni && got < n {
				t.Errorf("%s: ENI %d's VPC side received %d packets, want >= %d (per ENI: %v)", step, eni, got, n, delta)
			}
			if other != eni && got >= n {
				t.Errorf("%s: ENI %d's VPC side received %d packets, want them on ENI %d (per ENI: %v)", step, other, got, eni, delta)
			}
		}
	}
	expectVia("peered prefix in the config", 1)

	// The peered prefix leaves the config: the pod's rule goes, its traffic
	// to the peered VPC follows the main table (ENI 0).
	WriteFileAtomic(t, configPath, strings.Replace(config, "- 100.64.0.0/10\n", "", 1))
	a.WaitFor("peered rule removed", func() bool { return !slices.Contains(topo.nodeRules(podIP), peeredRule) })
	expectVia("peered prefix removed", 0)

	// Back in the config: back on ENI 1, the pod was never recreated.
	WriteFileAtomic(t, configPath, config)
	a.WaitFor("peered rule back", func() bool { return slices.Contains(topo.nodeRules(podIP), peeredRule) })
	expectVia("peered prefix added back", 1)

	cni.del(podNS, "web")
	if rules := topo.nodeRules(podIP); len(rules) != 0 {
		t.Errorf("rules left after DEL: %v", rules)
	}
	if links := topo.links("lxc"); len(links) != 0 {
		t.Errorf("veths left after DEL: %v", links)
	}
}

// bigCiliumNode is the sample CiliumNode with 12 more addresses on ENIs 1
// and 2 each, for 20 pods at once.
func bigCiliumNode(t *testing.T) string {
	node := sample(t, "ciliumnode.yaml")
	var pool, eni1, eni2 strings.Builder
	for i := 140; i < 152; i++ {
		fmt.Fprintf(&pool, "      10.130.100.%d:\n        resource: eni-0a1b2c3d4e5f00001\n", i)
		fmt.Fprintf(&eni1, "        - 10.130.100.%d\n", i)
	}
	for i := 30; i < 42; i++ {
		fmt.Fprintf(&pool, "      10.130.112.%d:\n        resource: eni-0a1b2c3d4e5f00002\n", i)
		fmt.Fprintf(&eni2, "        - 10.130.112.%d\n", i)
	}
	node = strings.Replace(node, "    pool:\n", "    pool:\n"+pool.String(), 1)
	node = strings.Replace(node, "        - 10.130.100.135\n", "        - 10.130.100.135\n"+eni1.String(), 1)
	node = strings.Replace(node, "        - 10.130.112.21\n", "        - 10.130.112.21\n"+eni2.String(), 1)
	return node
}

func TestPrivilegedCNITwentyPodsInParallel(t *testing.T) {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, bigCiliumNode(t), sample(t, "ip-masq-agent.yaml"))
	cni := newCNIRuntime(t, topo, a.APISocket())

	const pods = 20
	nss := make([]string, pods)
	for i := range nss {
		nss[i] = cni.newPod(fmt.Sprintf("p%d", i))
	}
	ips := make([]string, pods)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() { ips[i] = cni.add(nss[i], fmt.Sprintf("p%d", i)) })
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	distinct := slices.Clone(ips)
	slices.Sort(distinct)
	if distinct = slices.Compact(distinct); len(distinct) != pods {
		t.Fatalf("%d distinct IPs for %d pods: %v", len(distinct), pods, ips)
	}
	for _, ip := range ips {
		if len(topo.nodeRules(ip)) == 0 {
			t.Errorf("pod %s has no rules", ip)
		}
	}
	rows := a.Rows("eni-rules")
	for _, r := range rows {
		if st := fmt.Sprint(r["Status"]); !strings.Contains(st, "Done") {
			t.Errorf("eni-rules row not Done: %v", r)
			break
		}
	}

	for i := range pods {
		wg.Go(func() { cni.del(nss[i], fmt.Sprintf("p%d", i)) })
	}
	wg.Wait()
	if links := topo.links("lxc"); len(links) != 0 {
		t.Errorf("veths left: %v", links)
	}
	for _, ip := range ips {
		if rules := topo.nodeRules(ip); len(rules) != 0 {
			t.Errorf("rules of %s left: %v", ip, rules)
		}
	}
	if code, body, err := a.Get("/v1/ipam"); err != nil || code != 200 || strings.Contains(string(body), "10.130.") {
		t.Errorf("allocations left: %d %v %s", code, err, body)
	}
	checkpoint, err := os.ReadFile(filepath.Join(a.StateDir, "ipam-allocations.json"))
	if err != nil || strings.Contains(string(checkpoint), "10.130.") {
		t.Errorf("checkpoint entries left (%v): %s", err, checkpoint)
	}
}

func TestPrivilegedCNIDelAfterAgentRestart(t *testing.T) {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, sample(t, "ciliumnode.yaml"), sample(t, "ip-masq-agent.yaml"))
	cni := newCNIRuntime(t, topo, a.APISocket())
	podNS := cni.newPod("db")
	podIP := cni.add(podNS, "db")

	if out, err := cni.cnitool("check", podNS, "db"); err != nil {
		t.Errorf("cnitool check: %v\n%s", err, out)
	}
	if _, err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	a.Start()
	a.WaitHealthy()

	cni.del(podNS, "db")
	cni.del(podNS, "db") // twice is fine
	if rules := topo.nodeRules(podIP); len(rules) != 0 {
		t.Errorf("rules left after DEL: %v", rules)
	}
	if links := topo.links("lxc"); len(links) != 0 {
		t.Errorf("veths left after DEL: %v", links)
	}
	var list []map[string]any
	if _, body, err := a.Get("/v1/ipam"); err != nil || json.Unmarshal(body, &list) != nil || len(list) != 0 {
		t.Errorf("allocations left: %v %s", err, body)
	}
}

func TestPrivilegedCNIWithoutAgentLeavesNothing(t *testing.T) {
	requireIPAM(t)
	topo := newVPCTopology(t)
	cni := newCNIRuntime(t, topo, filepath.Join(t.TempDir(), "enimasq.sock"))
	podNS := cni.newPod("orphan")
	out, err := cni.cnitool("add", podNS, "orphan")
	if err == nil {
		t.Fatalf("ADD succeeded without an agent:\n%s", out)
	}
	if !strings.Contains(string(out), "enimasq-agent is not running") {
		t.Errorf("ADD error does not say the agent is not running:\n%s", out)
	}
	if links := topo.links("lxc"); len(links) != 0 {
		t.Errorf("veths left: %v", links)
	}
	// DEL of something never added succeeds... once the agent answers; with
	// no agent it asks the runtime to try again, after removing what is local.
	out, err = cni.cnitool("del", podNS, "orphan")
	if err == nil || !strings.Contains(string(out), "not running") {
		t.Errorf("DEL without an agent: %v\n%s", err, out)
	}
}
