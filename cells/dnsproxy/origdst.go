package dnsproxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// oobSize is room for the control messages of one datagram: the original
// destination (a sockaddr_in6 at most) and some spare.
const oobSize = 128

// Sizes of the sockaddrs the kernel puts in IP_ORIGDSTADDR and
// IPV6_ORIGDSTADDR (struct sockaddr_in, struct sockaddr_in6).
const (
	sizeofSockaddrInet4 = 16
	sizeofSockaddrInet6 = 28
)

// origDst is the original destination of a datagram that TPROXY delivered
// to a transparent socket with IP_RECVORIGDSTADDR / IPV6_RECVORIGDSTADDR:
// the address and port the pod sent to. oob is the datagram's control
// messages. A v4-mapped IPv6 address is returned as IPv4.
func origDst(oob []byte) (netip.AddrPort, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("control messages: %w", err)
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.SOL_IP && m.Header.Type == unix.IP_ORIGDSTADDR:
			return parseSockaddr(m.Data, unix.AF_INET)
		case m.Header.Level == unix.SOL_IPV6 && m.Header.Type == unix.IPV6_ORIGDSTADDR:
			return parseSockaddr(m.Data, unix.AF_INET6)
		}
	}
	return netip.AddrPort{}, errors.New("no original destination among the control messages")
}

// parseSockaddr reads a struct sockaddr_in or sockaddr_in6 of the family
// expected: the family in host order (little endian on every Linux this
// runs on: the kernel writes it natively), the port and the address in
// network order.
func parseSockaddr(b []byte, family uint16) (netip.AddrPort, error) {
	if len(b) < 2 {
		return netip.AddrPort{}, fmt.Errorf("sockaddr of %d bytes", len(b))
	}
	if got := binary.NativeEndian.Uint16(b); got != family {
		return netip.AddrPort{}, fmt.Errorf("sockaddr of family %d, want %d", got, family)
	}
	var addr netip.Addr
	switch family {
	case unix.AF_INET:
		if len(b) < sizeofSockaddrInet4 {
			return netip.AddrPort{}, fmt.Errorf("sockaddr_in of %d bytes", len(b))
		}
		addr = netip.AddrFrom4([4]byte(b[4:8]))
	case unix.AF_INET6:
		if len(b) < sizeofSockaddrInet6 {
			return netip.AddrPort{}, fmt.Errorf("sockaddr_in6 of %d bytes", len(b))
		}
		addr = netip.AddrFrom16([16]byte(b[8:24])).Unmap()
	default:
		return netip.AddrPort{}, fmt.Errorf("family %d", family)
	}
	port := binary.BigEndian.Uint16(b[2:4])
	if port == 0 || !addr.IsValid() || addr.IsUnspecified() {
		return netip.AddrPort{}, fmt.Errorf("original destination %s:%d", addr, port)
	}
	return netip.AddrPortFrom(addr, port), nil
}
