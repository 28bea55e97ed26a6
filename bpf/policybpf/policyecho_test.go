package policybpf

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/celltest"
)

// An ICMP echo is tracked with the direction of its requests (issue #36):
// after the pod pings the peer with identifier 777, only the peer's echo
// replies with that identifier pass as tracked. The peer's own echo
// requests with 777, and replies going the requests' way, are judged by
// the policy (here: the pod's ingress is isolated with no rule, so the
// peer's requests are denied), for ICMPv4 (8/0) and ICMPv6 (128/129).
func TestPrivilegedPolicyEchoTrackedByDirection(t *testing.T) {
	for _, fam := range []struct {
		name               string
		pod, peer          netip.Addr
		proto              uint32
		request, reply     byte
		otherReq, otherRep byte // the other family's numbers: no echo here
	}{
		{"IPv4", netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.1.2.3"), protocolICMP, 8, 0, 128, 129},
		{"IPv6", netip.MustParseAddr("fd00::5"), netip.MustParseAddr("fd01::3"), protocolICMPv6, 128, 129, 8, 0},
	} {
		t.Run(fam.name, func(t *testing.T) {
			pod, peer := fam.pod, fam.peer
			// The pod may send ICMP to the peer; nothing may reach it.
			prog, maps := echoProgram(t, pod, peer, []PortEntry{{Protocol: fam.proto}}, nil)
			echo := func(d Direction, typ byte, id uint16) PolicyResult {
				t.Helper()
				src, dst := pod, peer
				if d == Ingress {
					src, dst = peer, pod
				}
				res, err := prog.Run(d, echoFrame(t, src, dst, fam.proto, typ, id))
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			want := func(what string, got PolicyResult, allow bool, reason PolicyReason) {
				t.Helper()
				if got.Allow != allow || got.Reason != reason {
					t.Errorf("%s: %+v, want allow=%t (%s)", what, got, allow, reason)
				}
			}

			want("the pod's echo request, id 777", echo(Egress, fam.request, 777), true, PolicyAllowed)
			want("the peer's echo request, id 777", echo(Ingress, fam.request, 777), false, PolicyDenied)
			want("the peer's echo reply, id 777", echo(Ingress, fam.reply, 777), true, PolicyTracked)
			want("the pod's next echo request, id 777", echo(Egress, fam.request, 777), true, PolicyTracked)
			// A reply going the requests' way is judged (the egress policy
			// allows ICMP), not passed as tracked.
			want("the pod's echo reply, id 777", echo(Egress, fam.reply, 777), true, PolicyAllowed)
			passed := 0
			for range 20 {
				if res := echo(Ingress, fam.request, 777); res.Allow {
					passed++
				}
			}
			if passed != 0 {
				t.Errorf("%d of 20 echo requests of the peer with id 777 passed, want none", passed)
			}
			want("the peer's echo reply, id 778", echo(Ingress, fam.reply, 778), false, PolicyDenied)
			// The other family's echo numbers are no echo here: judged, not
			// tracked, and they open nothing.
			want("the peer's type "+fmt.Sprint(fam.otherReq)+", id 777", echo(Ingress, fam.otherReq, 777), false, PolicyDenied)
			want("the peer's type "+fmt.Sprint(fam.otherRep)+", id 777", echo(Ingress, fam.otherRep, 777), false, PolicyDenied)
			want("the pod's type "+fmt.Sprint(fam.otherReq)+", id 900", echo(Egress, fam.otherReq, 900), true, PolicyAllowed)
			want("the peer's reply after it, id 900", echo(Ingress, fam.reply, 900), false, PolicyDenied)

			conns := connections(t, maps[PolicyCTMapName])
			if len(conns) != 1 || conns[0].Protocol != uint8(fam.proto) || conns[0].PodPort != 777 || conns[0].PeerPort != 777 ||
				conns[0].EchoRequests != Egress || conns[0].Pod != pod || conns[0].Peer != peer {
				t.Errorf("tracked: %+v, want the pod's echo 777 only, its requests egress", conns)
			}
		})
	}
}

// The other way round: the peer pings the pod, whose ingress allows ICMP
// and whose egress allows nothing. The pod's replies pass as tracked; the
// pod's own echo requests with the peer's identifier are denied.
func TestPrivilegedPolicyEchoOpenedByIngress(t *testing.T) {
	pod, peer := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.1.2.3")
	prog, maps := echoProgram(t, pod, peer, nil, []PortEntry{{Protocol: protocolICMP}})
	run := func(d Direction, typ byte, id uint16) PolicyResult {
		t.Helper()
		src, dst := pod, peer
		if d == Ingress {
			src, dst = peer, pod
		}
		res, err := prog.Run(d, echoFrame(t, src, dst, protocolICMP, typ, id))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := run(Ingress, 8, 777); !res.Allow || res.Reason != PolicyAllowed {
		t.Fatalf("the peer's echo request: %+v", res)
	}
	if res := run(Egress, 0, 777); !res.Allow || res.Reason != PolicyTracked {
		t.Errorf("the pod's echo reply: %+v, want tracked", res)
	}
	if res := run(Egress, 8, 777); res.Allow || res.Reason != PolicyDenied {
		t.Errorf("the pod's echo request with the peer's identifier: %+v, want denied", res)
	}
	if res := run(Ingress, 0, 777); !res.Allow || res.Reason != PolicyAllowed {
		t.Errorf("the peer's echo reply (the requests' way): %+v, want judged (allowed by the ingress policy)", res)
	}
	conns := connections(t, maps[PolicyCTMapName])
	if len(conns) != 1 || conns[0].EchoRequests != Ingress {
		t.Errorf("tracked: %+v, want the peer's echo 777, its requests ingress", conns)
	}
}

// An ICMP error about an echo is related to the tracked echo only when it
// quotes a packet going the way that echo's packets go: an error the pod
// receives quoting its own request, or its reply to a request it received.
func TestPrivilegedPolicyEchoErrors(t *testing.T) {
	pod, peer, router := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("10.9.9.9")
	prog, _ := echoProgram(t, pod, peer, []PortEntry{{Protocol: protocolICMP}}, nil)
	run := func(d Direction, frame []byte) PolicyResult {
		t.Helper()
		res, err := prog.Run(d, frame)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// The error a router sends the pod (destination unreachable) quoting
	// an ICMP packet of type typ from src to dst.
	unreachable := func(src, dst netip.Addr, typ byte, id uint16) []byte {
		f := echoFrame(t, router, pod, protocolICMP, 3, 0)
		f[14+20+1] = 1 // host unreachable
		q := echoFrame(t, src, dst, protocolICMP, typ, id)
		return append(f, q[14:14+20+8]...)
	}
	if res := run(Egress, echoFrame(t, pod, peer, protocolICMP, 8, 777)); !res.Allow {
		t.Fatalf("the pod's echo request: %+v", res)
	}
	for _, c := range []struct {
		what  string
		frame []byte
		allow bool
		why   PolicyReason
	}{
		{"quoting the pod's echo request", unreachable(pod, peer, 8, 777), true, PolicyTracked},
		{"quoting a reply of the pod with the identifier", unreachable(pod, peer, 0, 777), false, PolicyDenied},
		{"quoting the pod's ICMPv4 type 128 with the identifier", unreachable(pod, peer, 128, 777), false, PolicyDenied},
		{"quoting the pod's echo request of another identifier", unreachable(pod, peer, 8, 778), false, PolicyDenied},
	} {
		if res := run(Ingress, c.frame); res.Allow != c.allow || res.Reason != c.why {
			t.Errorf("an error %s: %+v, want allow=%t (%s)", c.what, res, c.allow, c.why)
		}
	}
}

// ParsePolicyCTKey reads the echo's direction and refuses a key with an
// unknown one.
func TestParsePolicyCTKeyEcho(t *testing.T) {
	k := make([]byte, PolicyCTKeySize)
	copy(k[0:4], []byte{10, 0, 0, 5})
	copy(k[16:20], []byte{10, 1, 2, 3})
	binary.NativeEndian.PutUint16(k[32:], 777)
	binary.NativeEndian.PutUint16(k[34:], 777)
	k[36], k[37], k[38] = uint8(protocolICMP), 4, 2
	binary.NativeEndian.PutUint32(k[40:], 7)
	c, ok := ParsePolicyCTKey(k)
	if !ok || c.EchoRequests != Ingress || c.PodPort != 777 || c.Ifindex != 7 || c.Pod != netip.MustParseAddr("10.0.0.5") {
		t.Errorf("ParsePolicyCTKey: %+v %t", c, ok)
	}
	k[38] = 3
	if _, ok := ParsePolicyCTKey(k); ok {
		t.Errorf("a key with echo direction 3 parsed")
	}
	k[36], k[38] = uint8(ProtocolTCP), 0
	if c, ok := ParsePolicyCTKey(k); !ok || c.EchoRequests != 0 {
		t.Errorf("a TCP key: %+v %t", c, ok)
	}
}

// echoFrame is an ICMP (ICMPv6) frame from src to dst of type typ with
// identifier id.
func echoFrame(t *testing.T, src, dst netip.Addr, proto uint32, typ byte, id uint16) []byte {
	t.Helper()
	f, err := PolicyTestFrame(src, dst, uint8(proto), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	off := 14 + 20
	if src.Is6() {
		off = 14 + 40
	}
	f[off] = typ
	return f
}

// connections lists the tracked connections.
func connections(t *testing.T, m *ebpf.Map) []PolicyConnection {
	t.Helper()
	var out []PolicyConnection
	var cursor any
	key := make([]byte, m.KeySize())
	for range m.MaxEntries() + 1 {
		if err := m.NextKey(cursor, key); err != nil {
			break
		}
		c, ok := ParsePolicyCTKey(key)
		if !ok {
			t.Fatalf("a tracked connection's key %x does not parse", key)
		}
		out = append(out, c)
		cursor = append([]byte(nil), key...)
	}
	return out
}

// echoProgram loads the policy programs on pinned policy maps of the pod's
// family, a pinned connection-tracking map and mode map: the pod may send
// to the peer what egress allows and receive from anyone what ingress
// allows (both isolated).
func echoProgram(t *testing.T, pod, peer netip.Addr, egress, ingress []PortEntry) (*PolicyProgram, map[string]*ebpf.Map) {
	t.Helper()
	celltest.RequireRoot(t)
	dir := bpf.GlobalsDir(celltest.MountBPFFS(t))
	fam := bpf.FamilyOf(pod)
	maps := map[string]*ebpf.Map{}
	names := map[Direction]string{}
	for _, d := range []Direction{Egress, Ingress} {
		spec := PolicyMapSpec(d, fam, 1024)
		maps[spec.Name] = openPinnedForTest(t, spec, dir)
		names[d] = spec.Name
	}
	ctSpec, modeSpec, err := PolicyStateSpecs()
	if err != nil {
		t.Fatal(err)
	}
	maps[PolicyCTMapName] = openPinnedForTest(t, ctSpec, dir)
	maps[PolicyModeMapName] = openPinnedForTest(t, modeSpec, dir)
	for d, allow := range map[Direction][]PortEntry{Egress: egress, Ingress: ingress} {
		to := netip.PrefixFrom(peer, peer.BitLen()) // egress: the peer only
		if d == Ingress {
			to = netip.PrefixFrom(netip.IPv4Unspecified(), 0) // from anyone
			if pod.Is6() {
				to = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
			}
		}
		key, err := bpf.EncodePolicyKey(pod, to)
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := AllowValue(allow...).Encode()
		if err != nil {
			t.Fatal(err)
		}
		if err := maps[names[d]].Put(key, b); err != nil {
			t.Fatal(err)
		}
	}
	prog, err := LoadPolicyProgram(maps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog, maps
}
