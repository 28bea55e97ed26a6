package dnsproxy

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cmsg is one control message as the kernel writes it.
func cmsg(level, typ int, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = int32(level), int32(typ)
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

// sockaddr is the struct sockaddr_in or sockaddr_in6 of ap.
func sockaddr(ap netip.AddrPort) []byte {
	if ap.Addr().Is4() {
		b := make([]byte, sizeofSockaddrInet4)
		binary.NativeEndian.PutUint16(b, unix.AF_INET)
		binary.BigEndian.PutUint16(b[2:], ap.Port())
		a := ap.Addr().As4()
		copy(b[4:], a[:])
		return b
	}
	b := make([]byte, sizeofSockaddrInet6)
	binary.NativeEndian.PutUint16(b, unix.AF_INET6)
	binary.BigEndian.PutUint16(b[2:], ap.Port())
	a := ap.Addr().As16()
	copy(b[8:], a[:])
	return b
}

// origDstCmsg is the control message TPROXY's original destination
// arrives in.
func origDstCmsg(ap netip.AddrPort) []byte {
	if ap.Addr().Is4() {
		return cmsg(unix.SOL_IP, unix.IP_ORIGDSTADDR, sockaddr(ap))
	}
	return cmsg(unix.SOL_IPV6, unix.IPV6_ORIGDSTADDR, sockaddr(ap))
}

func TestOrigDst(t *testing.T) {
	other := cmsg(unix.SOL_SOCKET, unix.SO_TIMESTAMP, make([]byte, 16))
	for _, want := range []string{"10.0.1.2:53", "[fd00:1::2]:53", "[2001:db8::1]:5353"} {
		ap := netip.MustParseAddrPort(want)
		for _, oob := range [][]byte{origDstCmsg(ap), append(other, origDstCmsg(ap)...)} {
			got, err := origDst(oob)
			if err != nil || got != ap {
				t.Errorf("origDst(%s) = %s, %v", want, got, err)
			}
		}
	}
	// An IPv4-mapped address in an IPv6 sockaddr is IPv4.
	mapped := netip.AddrPortFrom(netip.MustParseAddr("::ffff:10.0.1.2"), 53)
	if got, err := origDst(cmsg(unix.SOL_IPV6, unix.IPV6_ORIGDSTADDR, sockaddr(mapped))); err != nil || got.String() != "10.0.1.2:53" {
		t.Errorf("mapped: %s, %v", got, err)
	}

	v4 := sockaddr(netip.MustParseAddrPort("10.0.1.2:53"))
	bad := map[string][]byte{
		"none":            nil,
		"other only":      other,
		"short v4":        cmsg(unix.SOL_IP, unix.IP_ORIGDSTADDR, v4[:8]),
		"v6 type, v4":     cmsg(unix.SOL_IPV6, unix.IPV6_ORIGDSTADDR, v4),
		"v4 type, v6":     cmsg(unix.SOL_IP, unix.IP_ORIGDSTADDR, sockaddr(netip.MustParseAddrPort("[fd00::1]:53"))),
		"port 0":          origDstCmsg(netip.MustParseAddrPort("10.0.1.2:0")),
		"unspecified":     origDstCmsg(netip.MustParseAddrPort("0.0.0.0:53")),
		"truncated cmsg":  origDstCmsg(netip.MustParseAddrPort("10.0.1.2:53"))[:20],
		"header too long": func() []byte { b := origDstCmsg(netip.MustParseAddrPort("10.0.1.2:53")); b[0] = 200; return b }(),
	}
	for name, oob := range bad {
		if got, err := origDst(oob); err == nil {
			t.Errorf("%s: origDst = %s, want an error", name, got)
		}
	}
}

// FuzzOrigDst: no control message makes origDst panic, and what it
// accepts is a usable destination that reads back the same.
func FuzzOrigDst(f *testing.F) {
	f.Add(origDstCmsg(netip.MustParseAddrPort("10.0.1.2:53")))
	f.Add(origDstCmsg(netip.MustParseAddrPort("[fd00:1::2]:53")))
	f.Add(append(cmsg(unix.SOL_SOCKET, unix.SO_TIMESTAMP, make([]byte, 16)), origDstCmsg(netip.MustParseAddrPort("10.0.1.2:53"))...))
	f.Add([]byte{})
	f.Add(make([]byte, 16))
	f.Fuzz(func(t *testing.T, oob []byte) {
		ap, err := origDst(oob)
		if err != nil {
			return
		}
		if !ap.IsValid() || ap.Port() == 0 || ap.Addr().IsUnspecified() || ap.Addr().Is4In6() {
			t.Fatalf("origDst accepted %s", ap)
		}
		if again, err := origDst(origDstCmsg(ap)); err != nil || again != ap {
			t.Fatalf("%s reads back as %s, %v", ap, again, err)
		}
	})
}
