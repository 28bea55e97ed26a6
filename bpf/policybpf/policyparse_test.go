package policybpf

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/celltest"
)

// What the programs cannot judge they drop, and what they judge they read
// whole: VLAN tags, other EtherTypes and truncated headers are dropped;
// IPv6 extension headers are walked to the ports; the first fragment of a
// datagram is judged and its later fragments follow it; an ICMP error
// passes only for a connection of the pod it is sent to or by; neighbour
// discovery passes only as RFC 4861 allows it.
func TestPrivilegedPolicyProgramParsesWhatItJudges(t *testing.T) {
	dir := bpf.GlobalsDir(celltest.MountBPFFS(t))
	maps := map[string]*ebpf.Map{}
	for _, d := range []Direction{Egress, Ingress} {
		for _, f := range []bpf.Family{bpf.IPv4, bpf.IPv6} {
			spec := PolicyMapSpec(d, f, 1024)
			maps[spec.Name] = openPinnedForTest(t, spec, dir)
		}
	}
	ctSpec, _, err := PolicyStateSpecs()
	if err != nil {
		t.Fatal(err)
	}
	fragsSpec, err := PolicyFragsSpec()
	if err != nil {
		t.Fatal(err)
	}
	maps[PolicyCTMapName] = openPinnedForTest(t, ctSpec, dir)
	maps[PolicyFragsMapName] = openPinnedForTest(t, fragsSpec, dir)

	pod4, peer4, other4 := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("10.0.0.7")
	pod6, peer6 := netip.MustParseAddr("2001:db8::5"), netip.MustParseAddr("2001:db8:1::9")
	put := func(d Direction, pod netip.Addr, peer string, entries ...PortEntry) {
		t.Helper()
		key, err := bpf.EncodePolicyKey(pod, netip.MustParsePrefix(peer))
		if err != nil {
			t.Fatal(err)
		}
		b, _, _ := AllowValue(entries...).Encode()
		if err := maps[PolicyMapName(d, bpf.FamilyOf(pod))].Put(key, b); err != nil {
			t.Fatal(err)
		}
	}
	// The pod may send UDP 53 to the peer, and nothing else; nothing may
	// reach it.
	for _, pp := range [][2]netip.Addr{{pod4, peer4}, {pod6, peer6}} {
		put(Egress, pp[0], netip.PrefixFrom(pp[0], 0).Masked().String())
		put(Egress, pp[0], netip.PrefixFrom(pp[1], pp[1].BitLen()).String(), PortEntry{Protocol: ProtocolUDP, StartPort: 53})
		put(Ingress, pp[0], netip.PrefixFrom(pp[0], 0).Masked().String())
	}
	prog, err := LoadPolicyProgram(maps)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()

	frame := func(src, dst netip.Addr, proto uint32, sport, dport uint16) []byte {
		t.Helper()
		f, err := PolicyTestFrame(src, dst, uint8(proto), sport, dport)
		if err != nil {
			t.Fatal(err)
		}
		return append(f, make([]byte, 32)...) // a payload
	}
	want := func(what string, d Direction, f []byte, allow bool, reason PolicyReason) {
		t.Helper()
		got, err := prog.Run(d, f)
		if err != nil {
			t.Fatal(err)
		}
		if got.Allow != allow || got.Reason != reason {
			t.Errorf("%s: %+v, want allow=%t (%s)", what, got, allow, reason)
		}
	}
	dns4, dns6 := frame(pod4, peer4, ProtocolUDP, 5353, 53), frame(pod6, peer6, ProtocolUDP, 5353, 53)
	want("IPv4 UDP 53", Egress, dns4, true, PolicyAllowed)
	want("IPv6 UDP 53", Egress, dns6, true, PolicyAllowed)

	// Frames the programs do not judge.
	want("VLAN-tagged", Egress, vlanTagged(dns4, 0x8100), false, PolicyMalformed)
	want("two VLAN tags", Egress, vlanTagged(vlanTagged(dns4, 0x8100), 0x8100), false, PolicyMalformed)
	want("802.1ad tag", Egress, vlanTagged(dns4, 0x88a8), false, PolicyMalformed)
	lldp := append([]byte{}, dns4...)
	lldp[12], lldp[13] = 0x88, 0xcc
	want("another EtherType", Egress, lldp, false, PolicyMalformed)
	// (BPF_PROG_TEST_RUN refuses an IPv4 frame shorter than its header.)
	badIHL := append([]byte{}, dns4...)
	badIHL[14] = 0x44
	want("IPv4 header length 4", Egress, badIHL, false, PolicyMalformed)
	v6in4 := append([]byte{}, dns4...)
	v6in4[14] = 0x65
	want("IPv4 EtherType, version 6", Egress, v6in4, false, PolicyMalformed)
	want("a truncated UDP header", Egress, dns4[:14+20+4], false, PolicyMalformed)
	want("a truncated TCP header", Egress, frame(pod4, peer4, ProtocolTCP, 1, 53)[:14+20+10], false, PolicyMalformed)

	// IPv6 extension headers are walked to the transport header.
	hbh, dst := ext6(0, 8), ext6(60, 16)
	want("IPv6 UDP 53 behind hop-by-hop and destination options", Egress, withExt6(frame(pod6, peer6, ProtocolUDP, 5354, 53), hbh, dst), true, PolicyAllowed)
	want("IPv6 UDP 54 behind them", Egress, withExt6(frame(pod6, peer6, ProtocolUDP, 5353, 54), hbh, dst), false, PolicyDenied)
	var many [][]byte
	for range 9 {
		many = append(many, ext6(60, 8))
	}
	want("nine IPv6 extension headers", Egress, withExt6(dns6, many...), false, PolicyMalformed)

	// Fragments: the first is judged, the later follow it.
	for _, tc := range []struct {
		family      string
		first, next func(id uint32, more bool, offset uint16, f []byte) []byte
		dns, denied []byte
	}{
		{"IPv4", fragment4, fragment4, frame(pod4, peer4, ProtocolUDP, 5355, 53), frame(pod4, peer4, ProtocolUDP, 5353, 54)},
		{"IPv6", fragment6, fragment6, frame(pod6, peer6, ProtocolUDP, 5355, 53), frame(pod6, peer6, ProtocolUDP, 5353, 54)},
	} {
		want(tc.family+" first fragment of UDP 53", Egress, tc.first(7, true, 0, tc.dns), true, PolicyAllowed)
		want(tc.family+" its later fragment", Egress, tc.next(7, false, 185, tc.dns), true, PolicyFragment)
		want(tc.family+" a later fragment of another datagram", Egress, tc.next(8, false, 185, tc.dns), false, PolicyFragmentUnknown)
		want(tc.family+" first fragment of UDP 54", Egress, tc.first(9, true, 0, tc.denied), false, PolicyDenied)
		want(tc.family+" its later fragment", Egress, tc.next(9, false, 185, tc.denied), false, PolicyFragmentUnknown)
		tiny := tc.first(10, true, 0, tc.dns)
		tiny = tiny[:len(tiny)-len(tc.dns)+len(tc.dns)-32-8+4] // 4 bytes of UDP header
		want(tc.family+" a first fragment too short for the ports", Egress, tiny, false, PolicyMalformed)
	}
	// An extension header after the fragment header: the later fragments
	// start with it, and still follow their first.
	withDst := withExt6(frame(pod6, peer6, ProtocolUDP, 5356, 53), ext6(60, 8))
	want("IPv6 first fragment, destination options after the fragment header", Egress, fragment6AtFront(12, true, 0, withDst), true, PolicyAllowed)
	want("its later fragment (next header: destination options)", Egress, fragment6AtFront(12, false, 185, withDst), true, PolicyFragment)

	// The fragmented answer of a tracked query passes whole.
	answer := frame(peer4, pod4, ProtocolUDP, 53, 5353)
	want("first fragment of the DNS answer", Ingress, fragment4(11, true, 0, answer), true, PolicyTracked)
	want("later fragment of the DNS answer", Ingress, fragment4(11, false, 185, answer), true, PolicyFragment)

	// ICMP errors: only about a connection of the pod itself.
	icmpErr := func(outerSrc, outerDst netip.Addr, quoted []byte) []byte {
		f := frame(outerSrc, outerDst, protocolICMP, 0, 0)[:14+20+8]
		f[14+20], f[14+20+1] = 3, 3 // destination unreachable, port unreachable
		binary.BigEndian.PutUint16(f[14+2:], uint16(20+8+20+8+400))
		f = append(f, quoted[14:14+20+8]...)
		return append(f, make([]byte, 400)...) // a payload
	}
	// other4 (no policy) opens UDP to the peer.
	want("another pod's UDP to the peer", Egress, frame(other4, peer4, ProtocolUDP, 4000, 53), true, PolicyNoPolicy)
	want("another pod's tracked UDP", Egress, frame(other4, peer4, ProtocolUDP, 4001, 53), true, PolicyNoPolicy)
	otherConn := frame(other4, peer4, ProtocolUDP, 4000, 53)
	want("an error to the pod quoting another pod's connection", Ingress, icmpErr(peer4, pod4, otherConn), false, PolicyDenied)
	want("an error from the pod quoting another pod's connection", Egress, icmpErr(pod4, peer4, frame(peer4, other4, ProtocolUDP, 53, 4000)), false, PolicyDenied)
	want("an error to the pod quoting its own query", Ingress, icmpErr(peer4, pod4, dns4), true, PolicyTracked)
	want("an error from the pod about the answer to its query", Egress, icmpErr(pod4, peer4, frame(peer4, pod4, ProtocolUDP, 53, 5353)), true, PolicyTracked)
	want("an error from the pod to another peer about the answer", Egress, icmpErr(pod4, other4, frame(peer4, pod4, ProtocolUDP, 53, 5353)), false, PolicyDenied)

	// Neighbour discovery as RFC 4861 allows it, and nothing else.
	nd := func(src, dst netip.Addr, typ, hopLimit byte) []byte {
		f := frame(src, dst, protocolICMPv6, 0, 0)
		f[14+40], f[14+7] = typ, hopLimit
		return append(f, make([]byte, 1000)...)
	}
	ll, solicited := netip.MustParseAddr("fe80::5"), netip.MustParseAddr("ff02::1:ff00:1")
	want("NS from link-local", Egress, nd(ll, solicited, 135, 255), true, PolicyNeighbor)
	want("NS from the pod's address to a solicited-node group", Egress, nd(pod6, solicited, 135, 255), true, PolicyNeighbor)
	want("NA from link-local to link-local", Ingress, nd(netip.MustParseAddr("fe80::1"), ll, 136, 255), true, PolicyNeighbor)
	want("NS with hop limit 64", Egress, nd(pod6, solicited, 135, 64), false, PolicyDenied)
	want("NS from the pod to a global address", Egress, nd(pod6, peer6, 135, 255), false, PolicyDenied)
	want("NA from a global address to the pod", Ingress, nd(peer6, pod6, 136, 255), false, PolicyDenied)
	want("RA from a global address", Ingress, nd(peer6, pod6, 134, 255), false, PolicyDenied)

	// Multicast listener discovery (RFC 3810): a pod's kernel reports its
	// groups when its device comes up, from its link-local address, with
	// hop limit 1 and a Router Alert (a hop-by-hop header).
	mld := func(src, dst netip.Addr, typ, hopLimit byte) []byte {
		return withExt6(nd(src, dst, typ, hopLimit), ext6(0, 8))
	}
	mldv2 := netip.MustParseAddr("ff02::16")
	want("MLDv2 report from link-local", Egress, mld(ll, mldv2, 143, 1), true, PolicyNeighbor)
	want("MLDv2 report from the unspecified address", Egress, mld(netip.IPv6Unspecified(), mldv2, 143, 1), true, PolicyNeighbor)
	want("MLDv1 report to its group", Egress, mld(ll, netip.MustParseAddr("ff05::1:3"), 131, 1), true, PolicyNeighbor)
	want("MLD query from the node", Ingress, mld(netip.MustParseAddr("fe80::1"), netip.MustParseAddr("ff02::1"), 130, 1), true, PolicyNeighbor)
	want("MLDv2 report with hop limit 2", Egress, mld(pod6, mldv2, 143, 2), false, PolicyDenied)
	want("MLDv2 report from the pod's global address", Egress, mld(pod6, mldv2, 143, 1), false, PolicyDenied)
	// Judged as any packet (the test run checks no source: no policy here).
	want("MLDv2 report to a site-scope group", Egress, mld(pod6, netip.MustParseAddr("ff05::16"), 143, 1), false, PolicyDenied)
	want("MLDv1 report to a unicast address", Egress, mld(ll, peer6, 131, 1), true, PolicyNoPolicy)
	want("MLD query to the pod's address", Ingress, mld(peer6, pod6, 130, 1), false, PolicyDenied)
}

// vlanTagged inserts an 802.1Q (or 802.1ad) tag of VLAN 0 after the MAC
// addresses.
func vlanTagged(f []byte, tpid uint16) []byte {
	out := append([]byte{}, f[:12]...)
	out = binary.BigEndian.AppendUint16(out, tpid)
	out = append(out, 0, 0)
	return append(out, f[12:]...)
}

// ext6 is an IPv6 extension header of type typ and size bytes (a multiple
// of 8), its next header to be filled.
func ext6(typ byte, size int) []byte {
	h := make([]byte, size)
	h[0] = typ // the chain is fixed by withExt6
	h[1] = byte(size/8 - 1)
	return h
}

// withExt6 puts extension headers (as ext6 makes them) between an IPv6
// frame's header and its transport header.
func withExt6(f []byte, exts ...[]byte) []byte {
	out := append([]byte{}, f[:14+40]...)
	next := out[14+6]
	types := make([]byte, len(exts))
	for i, e := range exts {
		types[i] = e[0]
	}
	out[14+6] = types[0]
	for i, e := range exts {
		e = append([]byte{}, e...)
		if i+1 < len(exts) {
			e[0] = types[i+1]
		} else {
			e[0] = next
		}
		out = append(out, e...)
	}
	out = append(out, f[14+40:]...)
	binary.BigEndian.PutUint16(out[14+4:], uint16(len(out)-14-40))
	return out
}

// fragment4 makes an IPv4 frame a fragment: identification id, offset in
// 8-byte units, more fragments or not; a later fragment carries the
// transport header's bytes as data.
func fragment4(id uint32, more bool, offset uint16, f []byte) []byte {
	out := append([]byte{}, f...)
	binary.BigEndian.PutUint16(out[14+4:], uint16(id))
	fo := offset
	if more {
		fo |= 0x2000
	}
	binary.BigEndian.PutUint16(out[14+6:], fo)
	return out
}

// fragment6 puts a fragment header into an IPv6 frame.
func fragment6(id uint32, more bool, offset uint16, f []byte) []byte {
	h := make([]byte, 8)
	h[0] = 44
	fo := offset << 3
	if more {
		fo |= 1
	}
	binary.BigEndian.PutUint16(h[2:], fo)
	binary.BigEndian.PutUint32(h[4:], id)
	return withExt6(f, h)
}

// fragment6AtFront puts a fragment header first in an IPv6 frame's chain,
// before the extension headers it already has.
func fragment6AtFront(id uint32, more bool, offset uint16, f []byte) []byte {
	h := make([]byte, 8)
	h[0] = f[14+6] // the frame's first next header
	fo := offset << 3
	if more {
		fo |= 1
	}
	binary.BigEndian.PutUint16(h[2:], fo)
	binary.BigEndian.PutUint32(h[4:], id)
	out := append([]byte{}, f[:14+40]...)
	out[14+6] = 44
	out = append(append(out, h...), f[14+40:]...)
	binary.BigEndian.PutUint16(out[14+4:], uint16(len(out)-14-40))
	return out
}
