package test

import (
	"errors"
	"net"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/enimasq/enimasq/cells/celltest"
)

// An echo a pod sent opens no way in for echo requests that reuse its
// identifier (issue #36): after b, which denies all ingress, pings the peer
// with identifier 777, the peer's own echo requests with identifier 777
// never reach b, while the peer's replies to b's echo still do.
func TestPrivilegedNetworkPolicyICMPEchoIdentifierReuse(t *testing.T) {
	node := newPolicyNode(t)
	node.addPod("b", "enim3b3b3b3b", podB)
	a, _ := node.startAgent(map[string]string{
		"b": policyEndpoint("b", podB, []string{"Ingress", "Egress"}, nil, []peRule{{cidr: "0.0.0.0/0"}}),
	})
	waitAttached(a, 1)

	const id = 777
	if !pingWithID(t, node, node.podNS("b"), policyPeerIP, id) {
		t.Fatalf("b's echo request with identifier %d to the peer was not answered", id)
	}

	// The peer's messages carry 400 bytes of data, so that the counters
	// tell them from the reply to b's echo.
	echo := func(typ icmp.Type, seq int) []byte {
		b, _ := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: seq, Data: make([]byte, 400)}}).Marshal(nil)
		return b
	}
	requests := node.countICMP(node.podNS("b"), "ip4:icmp", byte(ipv4.ICMPTypeEcho), 8+400)
	replies := node.countICMP(node.podNS("b"), "ip4:icmp", byte(ipv4.ICMPTypeEchoReply), 8+400)
	peer := node.ns[node.peerNS()]
	for seq := range 20 {
		sendICMP(t, peer, false, podB, echo(ipv4.ICMPTypeEcho, 100+seq), 0)
	}
	// The control: a reply of the peer to b's echo is b's connection.
	sendICMP(t, peer, false, podB, echo(ipv4.ICMPTypeEchoReply, 2), 0)
	settle(t, replies, 1)
	if n := requests.n.Load(); n != 0 {
		t.Errorf("%d of 20 echo requests of the peer with b's identifier %d reached b, which denies all ingress; want 0", n, id)
	}
	if n := replies.n.Load(); n != 1 {
		t.Errorf("b received %d echo replies of the peer, want 1", n)
	}
}

// pingWithID says whether an ICMP echo request with identifier id from
// the netns (a raw socket: the kernel keeps the identifier) to dst is
// answered.
func pingWithID(t *testing.T, n *policyNode, from, dst string, id int) bool {
	t.Helper()
	var ok bool
	err := celltest.InNS(n.ns[from], func() error {
		c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		b, _ := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("enimasq")}}).Marshal(nil)
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
		t.Fatalf("ping from %s: %s", from, err)
	}
	return ok
}
