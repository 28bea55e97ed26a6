package test

import (
	"bytes"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/enimasq/enimasq/cells/celltest"
)

// The attacker's tests: pods with CAP_NET_RAW sending what a well-behaved
// stack never would, each asserting on what reached the other side.

const podX = "10.0.0.4"

// icmpUnreachable is an ICMP port unreachable quoting the first 28 bytes
// of quoted (its IP and transport headers) and 400 bytes of payload.
func icmpUnreachable(quoted []byte) []byte {
	data := append(append([]byte{}, quoted[:28]...), make([]byte, 400)...)
	b, _ := (&icmp.Message{Type: ipv4.ICMPTypeDestinationUnreachable, Code: 3, Body: &icmp.DstUnreach{Data: data}}).Marshal(nil)
	return b
}

// An ICMP error passes only for a connection of the pod it is sent to or
// by: one quoting another pod's tracked connection is no way in or out of
// a pod that denies everything.
func TestPrivilegedNetworkPolicyICMPErrorsOfOtherConnections(t *testing.T) {
	node := newPolicyNode(t)
	node.addPod("b", "enim7b7b7b7b", podB)
	node.addPod("x", "enim7c7c7c7c", podX)
	a, _ := node.startAgent(map[string]string{
		"b": policyEndpoint("b", podB, []string{"Ingress", "Egress"}, nil, nil),
		"x": policyEndpoint("x", podX, []string{"Egress"}, nil, []peRule{{cidr: "0.0.0.0/0"}}),
	})
	waitAttached(a, 2)

	// x opens a UDP flow from port 40053 to the peer's 53: tracked.
	if err := celltest.InNS(node.ns[node.podNS("x")], func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(podX), Port: 40053}, &net.UDPAddr{IP: net.ParseIP(policyPeerIP), Port: 53})
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		_, err = c.Read(make([]byte, 8))
		return err
	}); err != nil {
		t.Fatalf("x's UDP flow to the peer: %v", err)
	}
	x, peer := netip.MustParseAddr(podX), netip.MustParseAddr(policyPeerIP)
	query := ipv4Packet(x, peer, 17, udpDatagram(40053, 53, nil))
	answer := ipv4Packet(peer, x, 17, udpDatagram(53, 40053, nil))

	atB := node.countICMP(node.podNS("b"), "ip4:icmp", 3, 8+28+400)
	atPeer := node.countICMP(node.peerNS(), "ip4:icmp", 3, 8+28+400)
	for range 3 {
		// In: x sends b an error about x's own query.
		sendICMP(t, node.ns[node.podNS("x")], false, podB, icmpUnreachable(query), 0)
		// Out: b sends the peer an error about the answer to x.
		sendICMP(t, node.ns[node.podNS("b")], false, policyPeerIP, icmpUnreachable(answer), 0)
	}
	// The control: x itself may send the peer an error about the answer
	// it received.
	sendICMP(t, node.ns[node.podNS("x")], false, policyPeerIP, icmpUnreachable(answer), 0)
	settle(t, atPeer, 1)
	if n := atB.n.Load(); n > 0 {
		t.Errorf("%d ICMP errors quoting x's connection reached b, which denies all ingress", n)
	}
	if n := atPeer.n.Load(); n != 1 {
		t.Errorf("the peer received %d ICMP errors, want 1 (x's own; none from b, which denies all egress)", n)
	}
}

// A pod that denies all egress sends nothing out by frames the programs
// cannot see into or do not expect: a 6000-byte frame (MTU 9000) that
// AF_PACKET sends as a paged skb, with its own source or a forged one, and
// frames with one or two VLAN tags of VLAN 0.
func TestPrivilegedNetworkPolicyRawFrames(t *testing.T) {
	node := newPolicyNode(t)
	const devA, devX = "enim8a8a8a8a", "enim8c8c8c8c"
	node.addPod("a", devA, podA)
	node.addPod("x", devX, podX)
	for _, l := range [][]string{{node.Node, devA}, {node.Node, devX}, {node.Node, "peer0"},
		{node.podNS("a"), "eth0"}, {node.podNS("x"), "eth0"}, {node.peerNS(), "eth0"}} {
		run(t, "ip", "-n", l[0], "link", "set", l[1], "mtu", "9000")
	}
	a, _ := node.startAgent(map[string]string{"a": policyEndpoint("a", podA, []string{"Egress"}, nil, nil)})
	waitAttached(a, 2) // x's device too: no policy selects x, which the programs allow

	got := node.countUDP(node.peerNS(), "udp4", policyPeerIP+":9999")
	peer := netip.MustParseAddr(policyPeerIP)
	udp := func(src string, size int) []byte {
		return ipv4Packet(netip.MustParseAddr(src), peer, 17, udpDatagram(40000, 9999, make([]byte, size)))
	}
	la, lx := node.podLink("a", devA), node.podLink("x", devX)
	for range 3 {
		node.sendFrames("a", la,
			ethernetFrame(la.gw, la.mac, 0x0800, 0, udp(podA, 6000)),
			ethernetFrame(la.gw, la.mac, 0x0800, 0, udp("10.0.0.99", 6000)),
			ethernetFrame(la.gw, la.mac, 0x0800, 2, udp(podA, 100)),
			ethernetFrame(la.gw, la.mac, 0x0800, 2, udp("10.0.0.99", 100)),
			ethernetFrame(la.gw, la.mac, 0x0800, 1, udp(podA, 100)),
			ethernetFrame(la.gw, la.mac, 0x0800, 0, udp(podA, 100)),
		)
	}
	// The control: x, which no policy selects, sends the same paged frame:
	// judged whole, and allowed.
	node.sendFrames("x", lx, ethernetFrame(lx.gw, lx.mac, 0x0800, 0, udp(podX, 6000)))
	settle(t, got, 1)
	if n := got.n.Load(); n != 1 {
		t.Errorf("the peer received %d datagrams, want 1 (x's; none of a's raw frames)", n)
	}
}

// IPv6 under the programs: neighbour discovery is no tunnel (global
// addresses, 1000 bytes, either way, at hop limit 255 or not), a
// fragmented datagram matches its port rule, and the fragmented replies
// of an allowed connection pass, over IPv4 and IPv6.
func TestPrivilegedNetworkPolicyIPv6NeighbourDiscoveryAndFragments(t *testing.T) {
	node := newPolicyNode(t)
	const device = "enim9a9a9a9a"
	node.addPod("a", device, podA)
	node.enableIPv6("a", device)
	// The peer echoes large datagrams on UDP 5300, IPv4 and IPv6.
	node.serveUDPEcho(node.peerNS(), "udp4", policyPeerIP+":5300")
	node.serveUDPEcho(node.peerNS(), "udp6", "["+peer6+"]:5300")

	pe := policyEndpoint("a", podA, []string{"Ingress", "Egress"},
		[]peRule{{cidr: peer6 + "/128", ports: []string{"UDP"}}},
		[]peRule{{cidr: policyPeerIP + "/32", ports: []string{"UDP 5300"}}, {cidr: peer6 + "/128", ports: []string{"UDP 5300"}}})
	pe = strings.Replace(pe, "  podSelectorEndpoints:\n", "  podSelectorEndpoints:\n  - {podIP: \""+pod6+"\", hostIP: "+policyNodeIP+", name: a, namespace: e2e}\n", 1)
	a, _ := node.startAgent(map[string]string{"a": pe}, "--enable-ipv6")
	waitAttached(a, 1)

	ndAtPeer := node.countICMP(node.peerNS(), "ip6:ipv6-icmp", 135, 1000)
	ndAtPod := node.countICMP(node.podNS("a"), "ip6:ipv6-icmp", 136, 1000)
	nd := func(typ ipv6.ICMPType) []byte {
		b, _ := (&icmp.Message{Type: typ, Body: &icmp.RawBody{Data: make([]byte, 1020)}}).Marshal(nil)
		return b
	}
	for _, hop := range []int{255, 64} {
		sendICMP(t, node.ns[node.podNS("a")], true, peer6, nd(ipv6.ICMPTypeNeighborSolicitation), hop)
		sendICMP(t, node.ns[node.peerNS()], true, pod6, nd(ipv6.ICMPTypeNeighborAdvertisement), hop)
	}

	// 3000 bytes of UDP from the peer, fragmented on its way: the pod
	// allows UDP on every port from the peer.
	got := node.countUDP(node.podNS("a"), "udp6", "["+pod6+"]:9999")
	if err := celltest.InNS(node.ns[node.peerNS()], func() error {
		c, err := net.Dial("udp6", "["+pod6+"]:9999")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(make([]byte, 3000))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for got.n.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got.n.Load() == 0 {
		t.Error("a fragmented IPv6 UDP datagram did not reach the pod, which allows UDP on every port from the peer")
	}
	// The pod's 3000-byte datagrams to UDP 5300 and their echoes:
	// fragmented both ways.
	for _, dst := range []string{policyPeerIP, "[" + peer6 + "]"} {
		if !node.udpEcho("a", dst+":5300", 3000) {
			t.Errorf("a fragmented datagram to %s:5300 or its fragmented echo did not pass (egress allows UDP 5300)", dst)
		}
	}
	if ndAtPeer.n.Load() > 0 || ndAtPod.n.Load() > 0 {
		t.Errorf("neighbour discovery with global addresses and 1000 bytes went through: %d to the peer, %d to the pod",
			ndAtPeer.n.Load(), ndAtPod.n.Load())
	}
}

// udpEcho says whether size bytes sent from the pod to addr come back whole.
func (n *policyNode) udpEcho(pod, addr string, size int) bool {
	var ok bool
	celltest.InNS(n.ns[n.podNS(pod)], func() error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		msg := bytes.Repeat([]byte("e"), size)
		if _, err := c.Write(msg); err != nil {
			return err
		}
		buf := make([]byte, 65536)
		k, err := c.Read(buf)
		ok = err == nil && bytes.Equal(buf[:k], msg)
		return nil
	})
	return ok
}

// serveUDPEcho echoes every datagram that reaches addr in the netns, whole.
func (n *policyNode) serveUDPEcho(ns, network, addr string) {
	n.t.Helper()
	if err := celltest.InNS(n.ns[ns], func() error { return listenUDP(n.t, network, addr, echo) }); err != nil {
		n.t.Fatal(err)
	}
}

// A pod that no policy selects is no way around another pod's policy: its
// device carries the programs too, so it sends only with its own source
// (not the peer's, which b admits), and as a local pod it may not send b
// ICMP errors about b's connections with the peer.
func TestPrivilegedNetworkPolicyPodWithoutPolicyForgesNothing(t *testing.T) {
	node := newPolicyNode(t)
	const devB, devX = "enimab1b1b1b", "enimac1c1c1c"
	node.addPod("b", devB, podB)
	node.addPod("x", devX, podX)
	a, _ := node.startAgent(map[string]string{
		"b": policyEndpoint("b", podB, []string{"Ingress"}, []peRule{{cidr: policyPeerIP + "/32", ports: []string{"UDP 9999"}}}, nil),
	})
	waitAttached(a, 2) // x's device too, though no policy selects x

	got := node.countUDP(node.podNS("b"), "udp4", podB+":9999")
	peer, b := netip.MustParseAddr(policyPeerIP), netip.MustParseAddr(podB)
	lx := node.podLink("x", devX)
	forged := ethernetFrame(lx.gw, lx.mac, 0x0800, 0, ipv4Packet(peer, b, 17, udpDatagram(40000, 9999, []byte("forged"))))
	node.sendFrames("x", lx, forged, forged, forged)

	// b's UDP flow from 7777 to the peer: tracked. x sends b errors about
	// it; the peer sends one (it may: the connection is its).
	if err := celltest.InNS(node.ns[node.podNS("b")], func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(podB), Port: 7777}, &net.UDPAddr{IP: net.ParseIP(policyPeerIP), Port: 9999})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("hello"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	errors := node.countICMP(node.podNS("b"), "ip4:icmp", 3, 8+28+400)
	flow := ipv4Packet(b, peer, 17, udpDatagram(7777, 9999, nil))
	for range 3 {
		sendICMP(t, node.ns[node.podNS("x")], false, podB, icmpUnreachable(flow), 0)
	}
	sendICMP(t, node.ns[node.peerNS()], false, podB, icmpUnreachable(flow), 0)
	// The control: the peer's own datagram to b.
	if err := celltest.InNS(node.ns[node.peerNS()], func() error {
		c, err := net.Dial("udp4", podB+":9999")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("real"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	settle(t, got, 1)
	settle(t, errors, 1)
	if n := got.n.Load(); n != 1 {
		t.Errorf("b received %d datagrams on 9999, want 1 (the peer's; none of x's with the peer's source)", n)
	}
	if n := errors.n.Load(); n != 1 {
		t.Errorf("b received %d ICMP errors about its flow, want 1 (the peer's; none of x's)", n)
	}
}
