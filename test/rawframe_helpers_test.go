package test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
)

// The raw frames of the attacker tests: what a pod with CAP_NET_RAW can
// put on its eth0 through AF_PACKET, byte for byte, past its own stack.

// checksum is the Internet checksum of b.
func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// ipv4Packet is an IPv4 header (no options, DF clear, TTL 64) with its
// checksum, followed by payload.
func ipv4Packet(src, dst netip.Addr, proto byte, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
	binary.BigEndian.PutUint16(h[4:], uint16(time.Now().UnixNano()))
	h[8], h[9] = 64, proto
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	binary.BigEndian.PutUint16(h[10:], checksum(h))
	return append(h, payload...)
}

// udpDatagram is a UDP header (checksum 0: none, as IPv4 allows) and
// payload.
func udpDatagram(sport, dport uint16, payload []byte) []byte {
	h := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint16(h[4:], uint16(8+len(payload)))
	return append(h, payload...)
}

// ethernetFrame is an Ethernet frame from src to dst of the EtherType,
// with 802.1Q tags of VLAN 0 (priority tags) before it, one per tag.
func ethernetFrame(dst, src net.HardwareAddr, etherType uint16, vlanTags int, payload []byte) []byte {
	f := append(append([]byte{}, dst...), src...)
	for range vlanTags {
		f = binary.BigEndian.AppendUint16(f, 0x8100)
		f = append(f, 0, 0)
	}
	f = binary.BigEndian.AppendUint16(f, etherType)
	return append(f, payload...)
}

// podLink is what a raw sender in a pod needs: its eth0 and the MAC of
// the node's side of the veth (the next hop of everything it sends).
type podLink struct {
	ifindex int
	mac, gw net.HardwareAddr
}

func (n *policyNode) podLink(pod, device string) podLink {
	n.t.Helper()
	var l podLink
	if err := celltest.InNS(n.ns[n.podNS(pod)], func() error {
		ifc, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		l.ifindex, l.mac = ifc.Index, ifc.HardwareAddr
		return nil
	}); err != nil {
		n.t.Fatal(err)
	}
	if err := celltest.InNS(n.ns[n.Node], func() error {
		ifc, err := net.InterfaceByName(device)
		if err != nil {
			return err
		}
		l.gw = ifc.HardwareAddr
		return nil
	}); err != nil {
		n.t.Fatal(err)
	}
	return l
}

// sendFrames writes each frame on the pod's eth0 through AF_PACKET. A
// frame longer than a page goes out as a paged skb with only its Ethernet
// header linear (packet_snd), as the 6000-byte frames did.
func (n *policyNode) sendFrames(pod string, l podLink, frames ...[]byte) {
	n.t.Helper()
	if err := celltest.InNS(n.ns[n.podNS(pod)], func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: l.ifindex, Halen: 6}
		copy(sa.Addr[:], l.gw)
		for _, f := range frames {
			if err := unix.Sendto(fd, f, 0, sa); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		n.t.Fatalf("send raw frames from %s: %v", pod, err)
	}
}

// counter counts what a listener in a netns receives.
type counter struct{ n atomic.Int64 }

// countUDP counts the datagrams that reach addr in the netns.
func (n *policyNode) countUDP(ns, network, addr string) *counter {
	n.t.Helper()
	c := &counter{}
	if err := celltest.InNS(n.ns[ns], func() error {
		return listenUDP(n.t, network, addr, func(net.PacketConn, []byte, net.Addr) { c.n.Add(1) })
	}); err != nil {
		n.t.Fatal(err)
	}
	return c
}

// countICMP counts the ICMP (network "ip4:icmp") or ICMPv6 ("ip6:ipv6-icmp")
// messages of a type, with at least minLen bytes, that reach the netns.
func (n *policyNode) countICMP(ns, network string, typ byte, minLen int) *counter {
	n.t.Helper()
	c := &counter{}
	if err := celltest.InNS(n.ns[ns], func() error {
		l, err := icmp.ListenPacket(network, "")
		if err != nil {
			return err
		}
		n.t.Cleanup(func() { l.Close() })
		go func() {
			buf := make([]byte, 65536)
			for {
				k, _, err := l.ReadFrom(buf)
				if err != nil {
					return
				}
				if k >= minLen && buf[0] == typ {
					c.n.Add(1)
				}
			}
		}()
		return nil
	}); err != nil {
		n.t.Fatal(err)
	}
	return c
}

// settle waits until the control counter reaches want (the path works,
// and what was sent before it had its chance to arrive), then a little
// more for packets on other paths.
func settle(t *testing.T, control *counter, want int64) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for control.n.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("the control packets did not arrive (%d of %d): the test's path is broken", control.n.Load(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
}

// sendICMP sends an ICMP (ICMPv6) message of the given bytes from the
// netns to dst, with the hop limit given (0: the default).
func sendICMP(t *testing.T, ns netns.NsHandle, v6 bool, dst string, msg []byte, hopLimit int) {
	t.Helper()
	if err := celltest.InNS(ns, func() error {
		network := "ip4:icmp"
		if v6 {
			network = "ip6:ipv6-icmp"
		}
		c, err := icmp.ListenPacket(network, "")
		if err != nil {
			return err
		}
		defer c.Close()
		if hopLimit > 0 {
			if v6 {
				if err := c.IPv6PacketConn().SetHopLimit(hopLimit); err != nil {
					return err
				}
				if err := c.IPv6PacketConn().SetMulticastHopLimit(hopLimit); err != nil {
					return err
				}
			} else if err := c.IPv4PacketConn().SetTTL(hopLimit); err != nil {
				return err
			}
		}
		_, err = c.WriteTo(msg, &net.IPAddr{IP: net.ParseIP(dst)})
		return err
	}); err != nil {
		t.Fatalf("send ICMP to %s: %v", dst, err)
	}
}
