package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// replySocket sends UDP answers to pods from the resolver's address and
// port: the pod's stub resolver is a connected socket and takes only
// datagrams from resolver:53.
//
// Why a raw socket: the transparent UDP socket can choose the source
// address of what it sends (IP_PKTINFO) but not the source port (it is the
// proxy's port). A UDP socket bound to resolver:53 (transparent, with
// SO_REUSEADDR) would have the port, but collides with a resolver of the
// node itself (a node-local cache on 169.254.20.10:53 in the node's
// namespace): it fails to bind, or joins the cache's SO_REUSEPORT group and
// takes the cache's queries. A raw IPPROTO_UDP socket with IP_TRANSPARENT
// sends a UDP header of its own from any source address (IP_PKTINFO /
// IPV6_PKTINFO); the kernel adds the IP header and fragments large answers.
// A raw UDP socket also gets a copy of every UDP datagram the node
// receives: a socket filter drops them all before they are queued.
type replySocket struct {
	v6   bool
	conn *net.IPConn
}

func listenReply(ctx context.Context, v6 bool) (*replySocket, error) {
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var err error
		cerr := c.Control(func(fd uintptr) { err = setupReplySocket(int(fd), v6) })
		return errors.Join(cerr, err)
	}}
	addr := netip.IPv4Unspecified()
	if v6 {
		addr = netip.IPv6Unspecified()
	}
	c, err := lc.ListenPacket(ctx, network("ip", v6)+":udp", addr.String())
	if err != nil {
		return nil, fmt.Errorf("raw UDP socket for answers: %w", err)
	}
	return &replySocket{v6: v6, conn: c.(*net.IPConn)}, nil
}

// setupReplySocket makes a raw socket one that never receives and may
// send from any address.
func setupReplySocket(fd int, v6 bool) error {
	drop := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: 1, Filter: &drop[0]}); err != nil {
		return fmt.Errorf("attach the drop-all filter: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 0); err != nil {
		return fmt.Errorf("SO_RCVBUF: %w", err)
	}
	level, opt := unix.SOL_IP, unix.IP_TRANSPARENT
	if v6 {
		level, opt = unix.SOL_IPV6, unix.IPV6_TRANSPARENT
	}
	if err := unix.SetsockoptInt(fd, level, opt, 1); err != nil {
		return fmt.Errorf("transparent: %w", err)
	}
	return nil
}

func (r *replySocket) Close() error { return r.conn.Close() }

// send sends the datagram pkt from `from` to `to`: pkt's first
// udpHeaderLen bytes are room for the UDP header, which send writes, and
// the rest is the payload.
func (r *replySocket) send(pkt []byte, from, to netip.AddrPort) error {
	if len(pkt) < udpHeaderLen || len(pkt) > 0xffff {
		return fmt.Errorf("UDP datagram of %d bytes", len(pkt))
	}
	if from.Addr().Is6() != r.v6 || to.Addr().Is6() != r.v6 {
		return fmt.Errorf("answer from %s to %s on the IPv6=%t socket", from, to, r.v6)
	}
	putUDPHeader(pkt, from, to)
	var oob []byte
	if r.v6 {
		oob = (&ipv6.ControlMessage{Src: from.Addr().AsSlice()}).Marshal()
	} else {
		oob = (&ipv4.ControlMessage{Src: from.Addr().AsSlice()}).Marshal()
	}
	if _, _, err := r.conn.WriteMsgIP(pkt, oob, &net.IPAddr{IP: to.Addr().AsSlice()}); err != nil {
		return fmt.Errorf("send the answer from %s to %s: %w", from, to, err)
	}
	return nil
}

// putUDPHeader writes the UDP header of the datagram pkt from `from` to
// `to`, checksum included.
func putUDPHeader(pkt []byte, from, to netip.AddrPort) {
	binary.BigEndian.PutUint16(pkt[0:], from.Port())
	binary.BigEndian.PutUint16(pkt[2:], to.Port())
	binary.BigEndian.PutUint16(pkt[4:], uint16(len(pkt)))
	binary.BigEndian.PutUint16(pkt[6:], 0)
	binary.BigEndian.PutUint16(pkt[6:], udpChecksum(from.Addr(), to.Addr(), pkt))
}

// udpChecksum is the checksum of the UDP datagram udp (its checksum field
// zero) from src to dst (RFC 768; RFC 8200 8.1 for IPv6): the one's
// complement of the one's complement sum of the pseudo-header (the
// addresses, the protocol, the UDP length) and the datagram, padded to an
// even length. A sum of 0 is sent as 0xffff: 0 means "no checksum", which
// IPv6 does not allow. The kernel does not compute it for a raw socket;
// the pod's kernel drops a datagram whose checksum is wrong (the veth
// does not mark it verified: TestPrivilegedBadChecksumDropped).
func udpChecksum(src, dst netip.Addr, udp []byte) uint16 {
	var sum uint64
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		sum = sumWords(sumWords(0, s[:]), d[:])
	} else {
		s, d := src.As16(), dst.As16()
		sum = sumWords(sumWords(0, s[:]), d[:])
	}
	sum += unix.IPPROTO_UDP + uint64(len(udp))
	sum = sumWords(sum, udp)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	if cs := ^uint16(sum); cs != 0 {
		return cs
	}
	return 0xffff
}

// sumWords adds b to sum as big-endian 16-bit words, an odd last byte as
// the high byte of a word.
func sumWords(sum uint64, b []byte) uint64 {
	for len(b) >= 2 {
		sum += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint64(b[0]) << 8
	}
	return sum
}
