package dnsproxy

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// verifies is how a receiver checks a UDP checksum (RFC 1071): the one's
// complement sum of the pseudo-header and the datagram, checksum
// included, is all ones. It is written apart from udpChecksum (word by
// word on a pseudo-header laid out in full) so that the two check each
// other.
func verifies(src, dst netip.Addr, udp []byte) bool {
	var pseudo []byte
	pseudo = append(pseudo, src.AsSlice()...)
	pseudo = append(pseudo, dst.AsSlice()...)
	if src.Is4() {
		pseudo = append(pseudo, 0, 17)
		pseudo = binary.BigEndian.AppendUint16(pseudo, uint16(len(udp)))
	} else {
		pseudo = binary.BigEndian.AppendUint32(pseudo, uint32(len(udp)))
		pseudo = append(pseudo, 0, 0, 0, 17)
	}
	all := append(pseudo, udp...)
	if len(all)%2 == 1 {
		all = append(all, 0)
	}
	var sum uint32
	for i := 0; i < len(all); i += 2 {
		sum += uint32(all[i])<<8 | uint32(all[i+1])
		sum = sum&0xffff + sum>>16
	}
	return sum == 0xffff
}

func TestUDPChecksum(t *testing.T) {
	// 8.8.8.8:53 -> 192.168.1.2:52000, payload "abc", worked out by
	// hand: the words 0x0808+0x0808+0xc0a8+0x0102+0x0011+0x000b (the
	// pseudo-header) + 0x0035+0xcb20+0x000b+0x6162+0x6300 sum to
	// 0x2_6198, folded 0x619a, complemented 0x9e65.
	pkt := []byte{0, 0, 0, 0, 0, 0, 0, 0, 'a', 'b', 'c'}
	putUDPHeader(pkt, netip.MustParseAddrPort("8.8.8.8:53"), netip.MustParseAddrPort("192.168.1.2:52000"))
	if got := binary.BigEndian.Uint16(pkt[6:]); got != 0x9e65 {
		t.Errorf("checksum %#04x, want 0x9e65", got)
	}
	if binary.BigEndian.Uint16(pkt[4:]) != 11 || binary.BigEndian.Uint16(pkt[0:]) != 53 || binary.BigEndian.Uint16(pkt[2:]) != 52000 {
		t.Errorf("header % x", pkt[:8])
	}

	r := rand.New(rand.NewPCG(1, 2))
	pairs := [][2]string{{"10.0.1.2:53", "10.0.0.2:40000"}, {"[fd00:1::2]:53", "[fd00::2]:40000"}, {"255.255.255.255:65535", "255.255.255.255:65535"}}
	for _, pair := range pairs {
		from, to := netip.MustParseAddrPort(pair[0]), netip.MustParseAddrPort(pair[1])
		for _, n := range []int{0, 1, 2, 3, 511, 512, 4096, 0xffff - udpHeaderLen} {
			pkt := make([]byte, udpHeaderLen+n)
			for i := udpHeaderLen; i < len(pkt); i++ {
				pkt[i] = byte(r.Uint32())
			}
			putUDPHeader(pkt, from, to)
			if !verifies(from.Addr(), to.Addr(), pkt) {
				t.Errorf("%s -> %s, %d bytes: checksum %#04x does not verify", from, to, n, binary.BigEndian.Uint16(pkt[6:]))
			}
			if binary.BigEndian.Uint16(pkt[6:]) == 0 {
				t.Errorf("%s -> %s: checksum 0", from, to)
			}
		}
	}
}

// TestUDPChecksumNeverZero: a datagram whose sum is 0 sends 0xffff (0
// would mean "none", not allowed over IPv6), and that verifies too.
func TestUDPChecksumNeverZero(t *testing.T) {
	from, to := netip.MustParseAddrPort("[::]:0"), netip.MustParseAddrPort("[::]:0")
	// Find a 2-byte payload whose checksum comes out as 0xffff, which is
	// what a computed 0 is sent as.
	for w := 0; w < 1<<16; w++ {
		pkt := []byte{0, 0, 0, 0, 0, 0, 0, 0, byte(w >> 8), byte(w)}
		putUDPHeader(pkt, from, to)
		if binary.BigEndian.Uint16(pkt[6:]) == 0xffff {
			if !verifies(from.Addr(), to.Addr(), pkt) {
				t.Fatalf("payload %#04x: 0xffff does not verify", w)
			}
			return
		}
	}
	t.Fatal("no payload gives the checksum 0xffff")
}
