package test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/enimasq/enimasq/cells/celltest"
)

// eniSpec is one ENI of the sample CiliumNode as the simulated VPC sees it.
type eniSpec struct {
	number  int
	mac     string
	address string // the ENI's own address, with its subnet's length
	gateway string // the first address of the subnet, owned by the VPC
}

var sampleVPC = []eniSpec{
	{0, "0a:58:0a:82:00:0a", "10.130.0.10/20", "10.130.0.1"},
	{1, "0a:58:0a:82:64:0a", "10.130.100.10/20", "10.130.96.1"},
	{2, "0a:58:0a:82:70:0a", "10.130.112.10/20", "10.130.112.1"},
}

// peeredAddress is in 100.64.0.0/10, a non-masquerade CIDR of the sample
// config: the "peered VPC" the pods talk to without masquerading.
const peeredAddress = "100.64.1.1"

// vpcTopology is a simulated node and VPC: the "node" netns holds the ENI
// links (veths with the ENIs' MACs), each peered into the "vpc" netns, which
// owns the ENI gateways and the peered VPC's address. The node's main table
// leaves by ENI 0, as on an EC2 instance.
type vpcTopology struct {
	t      *testing.T
	Node   string // named netns
	VPC    string
	vpcNS  netns.NsHandle
	nodeNS netns.NsHandle
}

func newVPCTopology(t *testing.T) *vpcTopology {
	t.Helper()
	celltest.RequireRoot(t)
	suffix := make([]byte, 4)
	rand.Read(suffix)
	topo := &vpcTopology{t: t, Node: "enq-node-" + hex.EncodeToString(suffix), VPC: "enq-vpc-" + hex.EncodeToString(suffix)}
	for _, name := range []string{topo.Node, topo.VPC} {
		run(t, "ip", "netns", "add", name)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	}
	var err error
	if topo.nodeNS, err = netns.GetFromName(topo.Node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { topo.nodeNS.Close() })
	if topo.vpcNS, err = netns.GetFromName(topo.VPC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { topo.vpcNS.Close() })

	node, err := netlink.NewHandleAt(topo.nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	vpc, err := netlink.NewHandleAt(topo.vpcNS)
	if err != nil {
		t.Fatal(err)
	}
	defer vpc.Close()

	for _, ns := range []string{topo.Node, topo.VPC} {
		run(t, "ip", "netns", "exec", ns, "sysctl", "-qw",
			"net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
			"net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	for _, eni := range sampleVPC {
		mac, _ := net.ParseMAC(eni.mac)
		nodeName, vpcName := fmt.Sprintf("eni%d", eni.number), fmt.Sprintf("vpc%d", eni.number)
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: nodeName, HardwareAddr: mac, MTU: 9001},
			PeerName:      vpcName,
			PeerNamespace: netlink.NsFd(topo.vpcNS),
		}
		if err := node.LinkAdd(veth); err != nil {
			t.Fatalf("veth %s: %s", nodeName, err)
		}
		mustLinkAddr(t, node, nodeName, eni.address)
		gw := netip.MustParseAddr(eni.gateway)
		subnet := netip.MustParsePrefix(eni.address).Masked()
		mustLinkAddr(t, vpc, vpcName, fmt.Sprintf("%s/%d", gw, subnet.Bits()))
		vpcLink, _ := vpc.LinkByName(vpcName)
		vpc.LinkSetMTU(vpcLink, 9001)
	}
	run(t, "ip", "-n", topo.Node, "route", "add", "default", "via", sampleVPC[0].gateway, "dev", "eni0")
	run(t, "ip", "-n", topo.VPC, "addr", "add", peeredAddress+"/32", "dev", "lo")
	return topo
}

func mustLinkAddr(t *testing.T, h *netlink.Handle, name, cidr string) {
	t.Helper()
	link, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(link, addr); err != nil {
		t.Fatalf("address %s on %s: %s", cidr, name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// vpcRx returns the packets received by the VPC side of each ENI.
func (topo *vpcTopology) vpcRx() map[int]uint64 {
	topo.t.Helper()
	h, err := netlink.NewHandleAt(topo.vpcNS)
	if err != nil {
		topo.t.Fatal(err)
	}
	defer h.Close()
	rx := map[int]uint64{}
	for _, eni := range sampleVPC {
		link, err := h.LinkByName(fmt.Sprintf("vpc%d", eni.number))
		if err != nil {
			topo.t.Fatal(err)
		}
		rx[eni.number] = link.Attrs().Statistics.RxPackets
	}
	return rx
}

// probe sends n UDP datagrams from the pod's netns to dst and returns, per
// ENI, how many packets the VPC received meanwhile.
func (topo *vpcTopology) probe(podNS, dst string, n int) map[int]uint64 {
	topo.t.Helper()
	before := topo.vpcRx()
	if err := sendUDPFrom(podNS, dst, n); err != nil {
		topo.t.Fatal(err)
	}
	after := topo.vpcRx()
	delta := map[int]uint64{}
	for k := range after {
		delta[k] = after[k] - before[k]
	}
	return delta
}

// sendUDPFrom sends n datagrams to dst:9 from a socket made in the named
// netns (inNS).
func sendUDPFrom(nsName, dst string, n int) error {
	target, err := netns.GetFromName(nsName)
	if err != nil {
		return err
	}
	defer target.Close()
	var conn net.Conn
	if err := celltest.InNS(target, func() (err error) {
		conn, err = net.Dial("udp4", net.JoinHostPort(dst, "9"))
		return err
	}); err != nil {
		return fmt.Errorf("udp socket in %s: %w", nsName, err)
	}
	defer conn.Close()
	for range n {
		if _, err := conn.Write([]byte("enimasq probe")); err != nil {
			return fmt.Errorf("send from %s to %s: %w", nsName, dst, err)
		}
	}
	return nil
}

// cniRuntime runs cnitool in the node's netns with enimasq-cni and a network
// configuration list pointing at the agent's socket.
type cniRuntime struct {
	t       *testing.T
	topo    *vpcTopology
	bin     Binaries
	confDir string
}

func newCNIRuntime(t *testing.T, topo *vpcTopology, agentSocket string) *cniRuntime {
	bin := Build(t)
	confDir := t.TempDir()
	conf := fmt.Sprintf(`{
  "cniVersion": "1.1.0",
  "name": "enimasq",
  "plugins": [{"type": "enimasq-cni", "agentSocket": %q}]
}
`, agentSocket)
	if err := os.WriteFile(filepath.Join(confDir, "10-enimasq.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return &cniRuntime{t: t, topo: topo, bin: bin, confDir: confDir}
}

// newPod makes an empty pod netns; it is deleted at cleanup.
func (c *cniRuntime) newPod(name string) string {
	ns := c.topo.Node + "-" + name
	if len(ns) > 60 {
		ns = ns[:60]
	}
	run(c.t, "ip", "netns", "add", ns)
	c.t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	return ns
}

type cniResult struct {
	IPs []struct {
		Address string `json:"address"`
		Gateway string `json:"gateway"`
	} `json:"ips"`
	Interfaces []struct {
		Name    string `json:"name"`
		Sandbox string `json:"sandbox"`
	} `json:"interfaces"`
}

// cnitool runs `cnitool <cmd> enimasq /var/run/netns/<podNS>` for pod
// default/<pod>.
func (c *cniRuntime) cnitool(cmd, podNS, pod string) ([]byte, error) {
	tool := exec.Command("ip", "netns", "exec", c.topo.Node, c.bin.CNITool, cmd, "enimasq", "/var/run/netns/"+podNS)
	tool.Env = append(os.Environ(),
		"CNI_PATH="+filepath.Dir(c.bin.CNI),
		"NETCONFPATH="+c.confDir,
		"CNI_ARGS=K8S_POD_NAMESPACE=default;K8S_POD_NAME="+pod,
		"CNI_CONTAINERID="+pod,
	)
	return tool.CombinedOutput()
}

func (c *cniRuntime) add(podNS, pod string) (podIP string) {
	c.t.Helper()
	out, err := c.cnitool("add", podNS, pod)
	if err != nil {
		c.t.Fatalf("cnitool add %s: %v\n%s", pod, err, out)
	}
	var res cniResult
	if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) != 1 {
		c.t.Fatalf("cnitool add %s: result %s (%v)", pod, out, err)
	}
	return strings.TrimSuffix(res.IPs[0].Address, "/32")
}

func (c *cniRuntime) del(podNS, pod string) {
	c.t.Helper()
	if out, err := c.cnitool("del", podNS, pod); err != nil {
		c.t.Fatalf("cnitool del %s: %v\n%s", pod, err, out)
	}
}

// links lists the node's links whose names start with prefix.
func (topo *vpcTopology) links(prefix string) []string {
	topo.t.Helper()
	h, err := netlink.NewHandleAt(topo.nodeNS)
	if err != nil {
		topo.t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		topo.t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}
