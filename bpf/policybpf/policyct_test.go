package policybpf

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/celltest"
)

// The programs are stateful: the replies of what the policy allowed pass
// the other way, TCP and UDP by ports and ICMP echo by identifier, a TCP
// RST closes the connection, and what was never allowed stays denied. In
// strict mode a pod without policy is denied.
func TestPrivilegedPolicyProgramTracksConnections(t *testing.T) {
	pod, peer, other := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("10.9.9.9")
	// The pod may open TCP 80, UDP 53 and ICMP to the peer; nothing may
	// reach it (ingress isolated, no rule).
	prog, maps := trackingProgram(t, 0, pod, peer,
		PortEntry{Protocol: ProtocolTCP, StartPort: 80}, PortEntry{Protocol: ProtocolUDP, StartPort: 53}, PortEntry{Protocol: protocolICMP})
	run := func(d Direction, frame []byte) PolicyResult {
		t.Helper()
		res, err := prog.Run(d, frame)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	frame := func(src, dst netip.Addr, proto uint32, sport, dport uint16) []byte {
		t.Helper()
		f, err := PolicyTestFrame(src, dst, uint8(proto), sport, dport)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	want := func(what string, got PolicyResult, allow bool, reason PolicyReason) {
		t.Helper()
		if got.Allow != allow || got.Reason != reason {
			t.Errorf("%s: %+v, want allow=%t (%s)", what, got, allow, reason)
		}
	}

	// Before anything was opened, the peer's packets are denied.
	want("unsolicited TCP from the peer", run(Ingress, frame(peer, pod, ProtocolTCP, 80, 40000)), false, PolicyDenied)
	want("SYN", run(Egress, frame(pod, peer, ProtocolTCP, 40000, 80)), true, PolicyAllowed)
	want("SYN-ACK", run(Ingress, frame(peer, pod, ProtocolTCP, 80, 40000)), true, PolicyTracked)
	want("ACK", run(Egress, frame(pod, peer, ProtocolTCP, 40000, 80)), true, PolicyTracked)
	want("another port of the peer", run(Ingress, frame(peer, pod, ProtocolTCP, 81, 40000)), false, PolicyDenied)
	want("another peer", run(Ingress, frame(other, pod, ProtocolTCP, 80, 40000)), false, PolicyDenied)

	// An ICMP error from a router on the way, quoting a packet of the
	// connection (path MTU discovery), is the connection's; one quoting
	// another connection is not.
	icmpError := func(quoted []byte) []byte {
		f := frame(other, pod, protocolICMP, 0, 0)
		f[14+20], f[14+20+1] = 3, 4 // destination unreachable, fragmentation needed
		return append(f, quoted[14:14+20+8]...)
	}
	want("fragmentation needed, for the connection", run(Ingress, icmpError(frame(pod, peer, ProtocolTCP, 40000, 80))), true, PolicyTracked)
	want("fragmentation needed, for another connection", run(Ingress, icmpError(frame(pod, peer, ProtocolTCP, 40001, 80))), false, PolicyDenied)

	rst := frame(peer, pod, ProtocolTCP, 80, 40000)
	rst[14+20+13] = 0x04 // RST
	want("RST", run(Ingress, rst), true, PolicyTracked)
	want("after the RST", run(Ingress, frame(peer, pod, ProtocolTCP, 80, 40000)), false, PolicyDenied)

	want("DNS query", run(Egress, frame(pod, peer, ProtocolUDP, 5353, 53)), true, PolicyAllowed)
	want("DNS answer", run(Ingress, frame(peer, pod, ProtocolUDP, 53, 5353)), true, PolicyTracked)

	want("echo request", run(Egress, frame(pod, peer, protocolICMP, 7, 0)), true, PolicyAllowed)
	reply := frame(peer, pod, protocolICMP, 7, 0)
	reply[14+20] = 0 // echo reply, same identifier
	want("echo reply", run(Ingress, reply), true, PolicyTracked)
	other7 := frame(peer, pod, protocolICMP, 8, 0)
	other7[14+20] = 0
	want("echo reply of another identifier", run(Ingress, other7), false, PolicyDenied)

	if n, err := PolicyConnections(maps[PolicyCTMapName]); err != nil || n != 2 {
		t.Errorf("%d tracked connections (%v), want 2 (TCP closed; UDP, ICMP)", n, err)
	}

	// Strict mode: a pod that no policy selects is denied.
	nobody := netip.MustParseAddr("10.0.0.6")
	want("no policy, standard", run(Egress, frame(nobody, peer, ProtocolTCP, 40001, 443)), true, PolicyNoPolicy)
	if err := SetPolicyMode(maps[PolicyModeMapName], PolicyModeStrict); err != nil {
		t.Fatal(err)
	}
	want("no policy, strict", run(Egress, frame(nobody, peer, ProtocolTCP, 40002, 443)), false, PolicyStrict)
	want("a policy, strict", run(Egress, frame(pod, peer, ProtocolTCP, 40003, 80)), true, PolicyAllowed)

	// IPv6 neighbour discovery passes in strict mode: IPv6 needs it, from
	// link-local addresses no policy names.
	ns := frame(netip.MustParseAddr("fe80::1"), netip.MustParseAddr("ff02::1:ff00:5"), protocolICMPv6, 0, 0)
	ns[14+40] = 135 // neighbour solicitation
	ns[14+7] = 255  // hop limit: not forwarded
	want("neighbour solicitation, strict", run(Egress, ns), true, PolicyNeighbor)
	echo := frame(netip.MustParseAddr("fe80::1"), netip.MustParseAddr("fe80::2"), protocolICMPv6, 9, 0)
	want("an echo from a link-local address, strict", run(Egress, echo), false, PolicyStrict)
}

// A full connection table evicts the least recently used connection and
// never lets a denied packet in: the replies of the connections it lost
// are judged by the policy again, and denied where it denies them.
func TestPrivilegedPolicyFullConnectionTableFailsClosed(t *testing.T) {
	pod, peer := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.1.2.3")
	// The pod may open UDP to the peer; nothing may reach it. The table
	// is small (--policy-conntrack-max 64).
	prog, maps := trackingProgram(t, 64, pod, peer, PortEntry{Protocol: ProtocolUDP})
	run := func(d Direction, src, dst netip.Addr, sport, dport uint16) PolicyResult {
		t.Helper()
		f, _ := PolicyTestFrame(src, dst, uint8(ProtocolUDP), sport, dport)
		res, err := prog.Run(d, f)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// Ten times the table's size of connections: the first ones go.
	const opened = 640
	for i := range uint16(opened) {
		if res := run(Egress, pod, peer, 10000+i, 53); !res.Allow {
			t.Fatalf("query %d: %+v", i, res)
		}
	}
	if n, err := PolicyConnections(maps[PolicyCTMapName]); err != nil || n > 64 {
		t.Fatalf("%d connections tracked (%v), want at most the table's 64", n, err)
	}
	tracked, denied := 0, 0
	for i := range uint16(opened) {
		res := run(Ingress, peer, pod, 53, 10000+i)
		switch {
		case res.Allow && res.Reason == PolicyTracked:
			tracked++
		case !res.Allow && res.Reason == PolicyDenied:
			denied++
		default:
			t.Fatalf("answer %d: %+v, want tracked or denied by the policy", i, res)
		}
	}
	if tracked == 0 || tracked > 64 || denied < opened-64 {
		t.Errorf("answers: %d passed as tracked, %d denied; want at most the table's 64 tracked and the evicted ones denied", tracked, denied)
	}
	if res := run(Ingress, peer, pod, 53, 9); res.Allow {
		t.Errorf("an unsolicited packet with the table full: %+v, want denied", res)
	}
}

// trackingProgram loads the policy programs on pinned IPv4 policy maps and
// a pinned connection-tracking map (ctMax entries, 0: the program's) and
// mode map: pod may send to peer what entries allow, and receives nothing
// but replies.
func trackingProgram(t *testing.T, ctMax uint32, pod, peer netip.Addr, entries ...PortEntry) (*PolicyProgram, map[string]*ebpf.Map) {
	t.Helper()
	dir := bpf.GlobalsDir(celltest.MountBPFFS(t))
	maps := map[string]*ebpf.Map{}
	for _, d := range []Direction{Egress, Ingress} {
		spec := PolicyMapSpec(d, bpf.IPv4, 1024)
		maps[spec.Name] = openPinnedForTest(t, spec, dir)
	}
	ctSpec, modeSpec, err := PolicyStateSpecs()
	if err != nil {
		t.Fatal(err)
	}
	if ctMax > 0 {
		ctSpec.MaxEntries = ctMax
	}
	maps[PolicyCTMapName] = openPinnedForTest(t, ctSpec, dir)
	maps[PolicyModeMapName] = openPinnedForTest(t, modeSpec, dir)
	for _, e := range []struct {
		m     string
		peer  netip.Prefix
		allow []PortEntry
	}{{PolicyEgressV4MapName, netip.PrefixFrom(peer, 32), entries}, {PolicyIngressV4MapName, netip.MustParsePrefix("0.0.0.0/0"), nil}} {
		key, _ := bpf.EncodePolicyKey(pod, e.peer)
		b, _, _ := AllowValue(e.allow...).Encode()
		if err := maps[e.m].Put(key, b); err != nil {
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
