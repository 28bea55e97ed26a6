package test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/enimasq/enimasq/cells/celltest"
)

// policyNode is a node for the enforcement tests: the "node" netns (where
// the agent runs) routes between pods, each in a netns behind a veth whose
// host side is in the node, and a peer netns on a subnet of its own.
type policyNode struct {
	t    testing.TB
	Node string // named netns
	ns   map[string]netns.NsHandle
}

const (
	policyPeerIP = "10.0.1.2"
	policyNodeIP = "10.0.1.1"
	podGateway   = "169.254.1.1"
)

// policyPorts are the TCP and UDP ports every pod and the peer serve.
var policyPorts = []int{53, 80, 81, 82, 83, 443, 8080}

func newPolicyNode(t testing.TB) *policyNode {
	t.Helper()
	celltest.RequireRoot(t)
	suffix := make([]byte, 3)
	rand.Read(suffix)
	n := &policyNode{t: t, Node: "enq-pnode-" + hex.EncodeToString(suffix), ns: map[string]netns.NsHandle{}}
	n.addNS(n.Node)
	run(t, "ip", "netns", "exec", n.Node, "sysctl", "-qw", "net.ipv4.ip_forward=1",
		"net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
		"net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	peer := n.Node + "-peer"
	n.addNS(peer)
	run(t, "ip", "-n", n.Node, "link", "add", "peer0", "type", "veth", "peer", "name", "eth0", "netns", peer)
	run(t, "ip", "-n", n.Node, "addr", "add", policyNodeIP+"/24", "dev", "peer0")
	run(t, "ip", "-n", n.Node, "link", "set", "peer0", "up")
	run(t, "ip", "-n", peer, "addr", "add", policyPeerIP+"/24", "dev", "eth0")
	run(t, "ip", "-n", peer, "link", "set", "eth0", "up")
	run(t, "ip", "-n", peer, "route", "add", "default", "via", policyNodeIP)
	n.serve(peer, policyPeerIP)
	return n
}

func (n *policyNode) addNS(name string) {
	n.t.Helper()
	run(n.t, "ip", "netns", "add", name)
	n.t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	n.ns[name] = nsHandle(n.t, name)
	run(n.t, "ip", "-n", name, "link", "set", "lo", "up")
}

// addPod makes a pod netns with ip behind the host-side veth device, as a
// CNI does: a /32 on the pod's eth0, the default route via a link-local
// gateway the host side owns, and the node's host route to the pod.
func (n *policyNode) addPod(name, device, ip string) {
	n.t.Helper()
	pod := n.Node + "-" + name
	n.addNS(pod)
	n.wirePod(pod, device, ip)
	n.serve(pod, ip)
}

func (n *policyNode) wirePod(pod, device, ip string) {
	n.t.Helper()
	run(n.t, "ip", "-n", n.Node, "link", "add", device, "type", "veth", "peer", "name", "eth0", "netns", pod)
	run(n.t, "ip", "-n", n.Node, "addr", "add", podGateway+"/32", "dev", device)
	run(n.t, "ip", "-n", n.Node, "link", "set", device, "up")
	run(n.t, "ip", "-n", n.Node, "route", "add", ip+"/32", "dev", device, "scope", "link")
	run(n.t, "ip", "-n", pod, "addr", "add", ip+"/32", "dev", "eth0")
	run(n.t, "ip", "-n", pod, "link", "set", "eth0", "up")
	run(n.t, "ip", "-n", pod, "route", "add", podGateway, "dev", "eth0", "scope", "link")
	run(n.t, "ip", "-n", pod, "route", "add", "default", "via", podGateway, "dev", "eth0")
}

// recreatePod deletes the pod's host-side device (its routes go with it)
// and makes it again, as a CNI does for a re-created sandbox.
func (n *policyNode) recreatePod(name, device, ip string) {
	n.t.Helper()
	run(n.t, "ip", "-n", n.Node, "link", "del", device)
	n.wirePod(n.Node+"-"+name, device, ip)
}

// serve answers on every policy port of ip in the netns: TCP with "ok"
// and the connection closed, UDP by echoing.
func (n *policyNode) serve(name, ip string) {
	n.t.Helper()
	err := celltest.InNS(n.ns[name], func() error {
		for _, port := range policyPorts {
			addr := net.JoinHostPort(ip, strconv.Itoa(port))
			if err := answerOK(n.t, "tcp4", addr); err != nil {
				return err
			}
			if err := listenUDP(n.t, "udp4", addr, echo); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		n.t.Fatalf("serve in %s: %s", name, err)
	}
}

// listenUDP listens on addr (in the calling thread's netns) and hands got
// every datagram that arrives, until the test ends.
func listenUDP(t testing.TB, network, addr string, got func(u net.PacketConn, b []byte, from net.Addr)) error {
	u, err := net.ListenPacket(network, addr)
	if err != nil {
		return err
	}
	t.Cleanup(func() { u.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			k, from, err := u.ReadFrom(buf)
			if err != nil {
				return
			}
			got(u, buf[:k], from)
		}
	}()
	return nil
}

// echo sends a datagram back whole.
func echo(u net.PacketConn, b []byte, from net.Addr) { u.WriteTo(b, from) }

// probeTimeout is how long a probe waits for its answer: a denied packet
// is dropped, so a probe that times out was denied.
const probeTimeout = 250 * time.Millisecond

// connect says whether a TCP connection from the netns to dst:port gets
// the server's answer (the SYN, the SYN-ACK and the data all pass).
func (n *policyNode) connect(from, dst string, port int) bool {
	return connectTCP(n.ns[from], dst, port)
}

// connectTCP says whether a TCP connection from ns to dst:port gets the
// answer of answerOK (the SYN, the SYN-ACK and the data all pass).
func connectTCP(ns netns.NsHandle, dst string, port int) bool {
	var ok bool
	celltest.InNS(ns, func() error {
		c, err := net.DialTimeout("tcp4", net.JoinHostPort(dst, strconv.Itoa(port)), probeTimeout)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(probeTimeout))
		buf := make([]byte, 2)
		_, err = c.Read(buf)
		ok = err == nil && string(buf) == "ok"
		return nil
	})
	return ok
}

// countReachedUntil calls reached over and over until stop, which returns how
// many of the calls were true (connections that got in meanwhile).
func countReachedUntil(reached func() bool) (stop func() int) {
	done, count := make(chan struct{}), make(chan int, 1)
	go func() {
		n := 0
		for {
			select {
			case <-done:
				count <- n
				return
			default:
			}
			if reached() {
				n++
			}
		}
	}()
	return func() int {
		close(done)
		return <-count
	}
}

// udp says whether a datagram from the netns to dst:port gets its echo.
func (n *policyNode) udp(from, dst string, port int) bool {
	var ok bool
	celltest.InNS(n.ns[from], func() error {
		c, err := net.Dial("udp4", net.JoinHostPort(dst, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(probeTimeout))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 8)
		k, err := c.Read(buf)
		ok = err == nil && string(buf[:k]) == "ping"
		return nil
	})
	return ok
}

// ping says whether an ICMP echo request from the netns to dst is answered.
func (n *policyNode) ping(from, dst string) bool {
	var ok bool
	err := celltest.InNS(n.ns[from], func() error {
		c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		id := int(time.Now().UnixNano() & 0xffff)
		msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("enimasq")}}
		b, _ := msg.Marshal(nil)
		if _, err := c.WriteTo(b, &net.IPAddr{IP: net.ParseIP(dst)}); err != nil {
			return err
		}
		c.SetDeadline(time.Now().Add(probeTimeout))
		buf := make([]byte, 1500)
		for {
			k, peer, err := c.ReadFrom(buf)
			if err != nil {
				return nil
			}
			m, err := icmp.ParseMessage(1, buf[:k])
			if err != nil || peer.String() != dst || m.Type != ipv4.ICMPTypeEchoReply {
				continue
			}
			if e, isEcho := m.Body.(*icmp.Echo); isEcho && e.ID == id {
				ok = true
				return nil
			}
		}
	})
	if err != nil && !errors.Is(err, net.ErrClosed) {
		n.t.Fatalf("ping from %s: %s", from, err)
	}
	return ok
}

// The IPv6 addresses of the pod that enableIPv6 makes dual-stack, the
// peer and the node's side towards it.
const pod6, peer6, node6 = "fd00::2", "fd00:1::2", "fd00:1::1"

// enableIPv6 turns IPv6 on in the node, the peer and the pod behind
// device, and gives them addresses and routes: pod6 on the pod (its
// gateway fe80::1 on device), peer6 on the peer, node6 towards it.
func (n *policyNode) enableIPv6(pod, device string) {
	n.t.Helper()
	t := n.t
	run(t, "ip", "netns", "exec", n.Node, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0",
		"net.ipv6.conf.default.disable_ipv6=0", "net.ipv6.conf.all.forwarding=1")
	for _, ns := range []string{n.podNS(pod), n.peerNS()} {
		run(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.default.disable_ipv6=0",
			"net.ipv6.conf.eth0.disable_ipv6=0")
	}
	run(t, "ip", "netns", "exec", n.Node, "sysctl", "-qw", "net.ipv6.conf."+device+".disable_ipv6=0", "net.ipv6.conf.peer0.disable_ipv6=0")
	run(t, "ip", "-n", n.Node, "addr", "add", node6+"/64", "dev", "peer0", "nodad")
	run(t, "ip", "-n", n.peerNS(), "addr", "add", peer6+"/64", "dev", "eth0", "nodad")
	run(t, "ip", "-n", n.peerNS(), "route", "add", "default", "via", node6)
	run(t, "ip", "-n", n.podNS(pod), "addr", "add", pod6+"/128", "dev", "eth0", "nodad")
	run(t, "ip", "-n", n.Node, "addr", "add", "fe80::1/64", "dev", device, "nodad")
	run(t, "ip", "-n", n.podNS(pod), "route", "add", "default", "via", "fe80::1", "dev", "eth0")
	run(t, "ip", "-n", n.Node, "route", "add", pod6+"/128", "dev", device)
}

// podNS names a pod's netns.
func (n *policyNode) podNS(pod string) string { return n.Node + "-" + pod }

func (n *policyNode) peerNS() string { return n.Node + "-peer" }

func (n *policyNode) String() string { return fmt.Sprintf("node %s", n.Node) }

// answerOK listens on addr (in the calling thread's netns) and answers
// every connection with "ok", then closes it, until the test ends.
func answerOK(t testing.TB, network, addr string) error {
	l, err := net.Listen(network, addr)
	if err != nil {
		return err
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for c, err := l.Accept(); err == nil; c, err = l.Accept() {
			c.Write([]byte("ok"))
			c.Close()
		}
	}()
	return nil
}

// startAgent starts an agent in the node's netns on a directory of the
// PolicyEndpoints given (file name without .yaml -> content), IPv4 only
// unless extra says otherwise, and returns it with the directory once it
// is healthy.
func (n *policyNode) startAgent(pes map[string]string, extra ...string) (*Agent, string) {
	n.t.Helper()
	a, dir := n.launchAgent(pes, extra...)
	a.WaitHealthy()
	return a, dir
}

// launchAgent is startAgent without the wait for health.
func (n *policyNode) launchAgent(pes map[string]string, extra ...string) (*Agent, string) {
	n.t.Helper()
	a := NewAgent(n.t)
	a.NetNSName = n.Node
	dir := filepath.Join(a.Dir, "policyendpoints")
	for name, pe := range pes {
		WriteFileAtomic(n.t, filepath.Join(dir, name+".yaml"), pe)
	}
	a.Args = append(a.Args, append([]string{"--enable-network-policy", "--policy-endpoints-path", dir, "--enable-ipv6=false"}, extra...)...)
	a.Start()
	return a, dir
}

// nsHandle opens the named netns, closed at cleanup.
func nsHandle(t testing.TB, name string) netns.NsHandle {
	t.Helper()
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// cniPolicyAgent is cniAgent on the sample CiliumNode and ip-masq-agent
// config with network policy on, from a PolicyEndpoint directory (returned)
// empty at start; extra are more of the agent's flags.
func cniPolicyAgent(t *testing.T, topo *vpcTopology, extra ...string) (*Agent, string) {
	t.Helper()
	var dir string
	a, _ := cniAgent(t, topo, sample(t, "ciliumnode.yaml"), sample(t, "ip-masq-agent.yaml"), func(a *Agent) {
		dir = filepath.Join(a.Dir, "policyendpoints")
		WriteFileAtomic(t, filepath.Join(dir, ".keep"), "")
		a.Args = append(append(a.Args, "--enable-network-policy", "--policy-endpoints-path", dir), extra...)
	})
	return a, dir
}

// onCNINode is a PolicyEndpoint of policyEndpoint for the VPC topology's
// node (its hostIP) instead of the policy node's.
func onCNINode(pe string) string {
	return strings.ReplaceAll(pe, "hostIP: "+policyNodeIP, "hostIP: 10.130.0.10")
}

// waitAttached waits until n pod devices carry the programs (their rows of
// policy-attachments Done).
func waitAttached(a *Agent, n int) {
	a.t.Helper()
	a.WaitFor(fmt.Sprintf("%d pod devices carrying the programs", n), func() bool {
		return strings.Count(a.MustDbg("shell", "--", "db/show", "policy-attachments"), "Done") == n
	})
}
