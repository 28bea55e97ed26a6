package awspeer

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/enimasq/enimasq/cells/celltest"
)

var (
	pod  = netip.MustParseAddr("10.0.0.5")
	peer = netip.MustParseAddr("10.1.2.3")
)

// newPeer is a Peer for tb, skipped without root or the build's tools.
func newPeer(tb testing.TB) *Peer {
	tb.Helper()
	celltest.RequireRoot(tb)
	p, err := New()
	if errors.Is(err, ErrMissingTools) {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Error(err)
		}
	})
	return p
}

func frame(tb testing.TB, dst netip.Addr, port uint16) []byte {
	tb.Helper()
	f, err := Frame(pod, dst, 40000, port)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

func TestFrameIsThePolicyTestFrameWithSYN(t *testing.T) {
	// policybpf.PolicyTestFrame(10.0.0.5, 10.1.2.3, TCP, 40000, 999), the frame
	// of BenchmarkPolicyProgramPerPacket's decided packet: the same bytes
	// but the TCP flags (byte 47), which neither program reads.
	want, _ := hex.DecodeString("00000000000000000000000008004500002800000000400600000a0000050a0102039c4003e700000000000000005000000000000000")
	want[47] = 0x02
	if got := frame(t, peer, 999); !bytes.Equal(got, want) {
		t.Errorf("Frame = %x, want %x", got, want)
	}
}

func TestEncoding(t *testing.T) {
	key, err := TrieKey(netip.MustParsePrefix("10.1.2.0/24"))
	must(t, err)
	if want := []byte{24, 0, 0, 0, 10, 1, 2, 0}; !bytes.Equal(key, want) {
		t.Errorf("TrieKey = %v, want %v", key, want)
	}
	if _, err := TrieKey(netip.MustParsePrefix("fd00::/64")); err == nil {
		t.Error("TrieKey of an IPv6 prefix: no error")
	}

	all, err := NetworkPolicyValue(nil)
	must(t, err)
	if len(all) != 288 || all[0] != 254 || !bytes.Equal(all[1:], make([]byte, 287)) {
		t.Errorf("allow-all value = %v", all)
	}
	np, err := NetworkPolicyValue([]PortRule{{ProtocolTCP, 80, 0}, {ProtocolUDP, 5000, 6000}})
	must(t, err)
	want := make([]byte, 288)
	copy(want, []byte{6, 0, 0, 0, 80, 0, 0, 0, 0, 0, 0, 0, 17, 0, 0, 0, 0x88, 0x13, 0, 0, 0x70, 0x17, 0, 0})
	if !bytes.Equal(np, want) {
		t.Errorf("NetworkPolicyValue = %v", np[:24])
	}
	if _, err := NetworkPolicyValue(make([]PortRule, 25)); err == nil {
		t.Error("25 port entries: no error")
	}

	cp, err := ClusterPolicyValue([]ClusterRule{{ProtocolTCP, BaselinePriorityOffset + 7, ActionPass, 22, 0}})
	must(t, err)
	want = make([]byte, 384)
	copy(want, []byte{6, 0, 0, 0, 0x68, 0x4e, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0}) // 2007*10+2 = 20072
	if !bytes.Equal(cp, want) {
		t.Errorf("ClusterPolicyValue = %v", cp[:16])
	}
}

// TestPeerVerdicts runs the AWS agent's handle_egress on one packet at a
// time and checks its verdict and the tier of its event.
func TestPeerVerdicts(t *testing.T) {
	peer16 := netip.MustParsePrefix("10.1.0.0/16")
	peer32 := netip.PrefixFrom(peer, 32)
	other := netip.MustParseAddr("10.9.9.9")
	np := []PortRule{{ProtocolTCP, 1023, 0}, {ProtocolTCP, 8000, 8100}, {ProtocolUDP, 53, 0}}
	type packet struct {
		dst     netip.Addr
		port    uint16
		verdict uint32
		tier    Tier
	}
	for _, tc := range []struct {
		name          string
		np, cp        PodState
		netPolicy     map[netip.Prefix][]PortRule
		clusterPolicy map[netip.Prefix][]ClusterRule
		packets       []packet
	}{{
		name: "network policy", np: PoliciesApplied, cp: DefaultAllow,
		netPolicy: map[netip.Prefix][]PortRule{peer32: np},
		packets: []packet{
			{peer, 1023, VerdictOK, TierNetworkPolicy},
			{peer, 999, VerdictShot, TierNetworkPolicy},
			{peer, 8000, VerdictOK, TierNetworkPolicy},
			{peer, 8100, VerdictOK, TierNetworkPolicy},
			{peer, 8101, VerdictShot, TierNetworkPolicy},
			{peer, 53, VerdictShot, TierNetworkPolicy}, // UDP only
			{other, 1023, VerdictShot, TierNetworkPolicy},
		},
	}, {
		name: "allow all and deny all", np: PoliciesApplied, cp: DefaultAllow,
		netPolicy: map[netip.Prefix][]PortRule{
			peer16: nil,
			peer32: {{Protocol: ProtocolReserved}, {ProtocolTCP, 1023, 0}},
		},
		packets: []packet{
			{netip.MustParseAddr("10.1.7.7"), 4444, VerdictOK, TierNetworkPolicy},
			{peer, 1023, VerdictShot, TierNetworkPolicy}, // the longest prefix alone decides
		},
	}, {
		name: "admin deny over network policy allow", np: PoliciesApplied, cp: PoliciesApplied,
		netPolicy:     map[netip.Prefix][]PortRule{peer32: np},
		clusterPolicy: map[netip.Prefix][]ClusterRule{peer16: {{ProtocolTCP, 100, ActionDeny, 1023, 0}}},
		packets: []packet{
			{peer, 1023, VerdictShot, TierAdmin},
			{peer, 8050, VerdictOK, TierNetworkPolicy},
		},
	}, {
		name: "admin accept over network policy deny", np: PoliciesApplied, cp: PoliciesApplied,
		netPolicy:     map[netip.Prefix][]PortRule{peer32: np},
		clusterPolicy: map[netip.Prefix][]ClusterRule{peer16: {{ProtocolTCP, 100, ActionAccept, 990, 1000}}},
		packets: []packet{
			{peer, 999, VerdictOK, TierAdmin},
			{peer, 1001, VerdictShot, TierNetworkPolicy},
		},
	}, {
		name: "admin: lower priority first, deny first at one priority, pass", np: PoliciesApplied, cp: PoliciesApplied,
		netPolicy: map[netip.Prefix][]PortRule{peer32: np},
		clusterPolicy: map[netip.Prefix][]ClusterRule{peer16: {
			{ProtocolTCP, 200, ActionAccept, 999, 0},
			{ProtocolTCP, 100, ActionDeny, 999, 0},
			{ProtocolTCP, 300, ActionAccept, 1023, 0},
			{ProtocolTCP, 300, ActionDeny, 1023, 0},
			{ProtocolTCP, 50, ActionPass, 8000, 0},
			{ProtocolTCP, 60, ActionDeny, 8000, 0},
		}},
		packets: []packet{
			{peer, 999, VerdictShot, TierAdmin},
			{peer, 1023, VerdictShot, TierAdmin},
			{peer, 8000, VerdictOK, TierNetworkPolicy},
		},
	}, {
		name: "baseline after network policy", np: DefaultAllow, cp: PoliciesApplied,
		clusterPolicy: map[netip.Prefix][]ClusterRule{peer16: {
			{ProtocolTCP, BaselinePriorityOffset + 10, ActionDeny, 22, 0},
			{ProtocolAny, BaselinePriorityOffset + 20, ActionAccept, 0, 0},
		}},
		packets: []packet{
			{peer, 22, VerdictShot, TierBaseline},
			{peer, 23, VerdictOK, TierBaseline},
			{other, 22, VerdictOK, TierDefault},
		},
	}, {
		name: "network policy before baseline", np: PoliciesApplied, cp: PoliciesApplied,
		netPolicy:     map[netip.Prefix][]PortRule{peer32: np},
		clusterPolicy: map[netip.Prefix][]ClusterRule{peer16: {{ProtocolAny, BaselinePriorityOffset + 10, ActionAccept, 0, 0}}},
		packets: []packet{
			{peer, 999, VerdictShot, TierNetworkPolicy},
			{peer, 1023, VerdictOK, TierNetworkPolicy},
		},
	}, {
		name: "default deny", np: DefaultDeny, cp: DefaultAllow,
		packets: []packet{{peer, 1023, VerdictShot, TierDefault}},
	}, {
		name: "default allow", np: DefaultAllow, cp: DefaultAllow,
		packets: []packet{{peer, 1023, VerdictOK, TierDefault}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPeer(t)
			must(t, p.SetPodState(tc.np, tc.cp))
			for cidr, rules := range tc.netPolicy {
				must(t, p.AddNetworkPolicy(cidr, rules))
			}
			for cidr, rules := range tc.clusterPolicy {
				must(t, p.AddClusterPolicy(cidr, rules))
			}
			for _, pk := range tc.packets {
				must(t, p.ResetConntrack())
				f := frame(t, pk.dst, pk.port)
				verdict, _, err := p.Run(f, 1)
				must(t, err)
				events, err := p.Events()
				must(t, err)
				if verdict != pk.verdict || len(events) != 1 || events[0].Tier != pk.tier {
					t.Errorf("%s:%d: verdict %d, events %+v; want verdict %d, tier %d", pk.dst, pk.port, verdict, events, pk.verdict, pk.tier)
					continue
				}
				want := Event{Src: pod, Dst: pk.dst, SrcPort: 40000, DstPort: uint32(pk.port), Protocol: ProtocolTCP,
					Verdict: 1 - pk.verdict/2 /* the event: 1 allowed, 0 denied */, PacketSize: uint32(len(f)), Egress: true, Tier: pk.tier}
				if events[0] != want {
					t.Errorf("%s:%d: event %+v, want %+v", pk.dst, pk.port, events[0], want)
				}
				n, err := p.ConntrackLen()
				must(t, err)
				if tracked := pk.verdict == VerdictOK; tracked != (n == 1) {
					t.Errorf("%s:%d: %d tracked connections after verdict %d", pk.dst, pk.port, n, verdict)
				}
			}
		})
	}
}

func TestPeerMissingPodStateDrops(t *testing.T) {
	p := newPeer(t)
	must(t, p.AddNetworkPolicy(netip.PrefixFrom(peer, 32), nil))
	verdict, _, err := p.Run(frame(t, peer, 1023), 1)
	must(t, err)
	events, err := p.Events()
	must(t, err)
	if verdict != VerdictShot || len(events) != 1 || events[0].Tier != TierError {
		t.Errorf("verdict %d, events %+v; want a drop in the error tier", verdict, events)
	}
}

// TestPeerConntrack: a tracked connection passes without its rule until the
// pod's state changes, and Forget and ResetConntrack end it.
func TestPeerConntrack(t *testing.T) {
	p := newPeer(t)
	must(t, p.SetPodState(PoliciesApplied, DefaultAllow))
	cidr := netip.PrefixFrom(peer, 32)
	must(t, p.AddNetworkPolicy(cidr, []PortRule{{ProtocolTCP, 1023, 0}}))
	f := frame(t, peer, 1023)
	run := func(want uint32) {
		t.Helper()
		verdict, _, err := p.Run(f, 1)
		must(t, err)
		if verdict != want {
			t.Fatalf("verdict %d, want %d", verdict, want)
		}
	}
	run(VerdictOK)
	key, err := TrieKey(cidr)
	must(t, err)
	must(t, p.Map(EgressMapName).Delete(key))
	run(VerdictOK) // tracked
	must(t, p.Forget(f))
	if err := p.Forget(f); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("Forget twice: %v", err)
	}
	run(VerdictShot)

	must(t, p.AddNetworkPolicy(cidr, []PortRule{{ProtocolTCP, 1023, 0}}))
	run(VerdictOK)
	must(t, p.Map(EgressMapName).Delete(key))
	must(t, p.SetPodState(PoliciesApplied, PoliciesApplied)) // re-evaluated: denied, forgotten
	run(VerdictShot)
	if n, err := p.ConntrackLen(); err != nil || n != 0 {
		t.Errorf("%d tracked connections (%v) after the re-evaluated drop", n, err)
	}

	must(t, p.AddNetworkPolicy(cidr, nil))
	run(VerdictOK)
	must(t, p.ResetConntrack())
	if n, err := p.ConntrackLen(); err != nil || n != 0 {
		t.Errorf("%d tracked connections (%v) after ResetConntrack", n, err)
	}
}

func TestPeerFillEvents(t *testing.T) {
	p := newPeer(t)
	must(t, p.SetPodState(DefaultAllow, DefaultAllow))
	must(t, p.FillEvents())
	verdict, _, err := p.Run(frame(t, peer, 1023), 1)
	must(t, err)
	if verdict != VerdictOK {
		t.Errorf("verdict %d with the ring full", verdict)
	}
	events, err := p.Events()
	must(t, err)
	want := int(p.Map(EventsMapName).MaxEntries()) / (eventSize + 8)
	if len(events) != want || events[len(events)-1] != (Event{Src: netip.IPv4Unspecified(), Dst: netip.IPv4Unspecified()}) {
		t.Errorf("%d events, the last %+v; want %d of FillEvents' and not the program's", len(events), events[len(events)-1], want)
	}
	if _, _, err := p.Run(frame(t, peer, 1024), 1); err != nil {
		t.Fatal(err)
	}
	if events, err := p.Events(); err != nil || len(events) != 1 || events[0].DstPort != 1024 {
		t.Errorf("after draining: events %+v, %v", events, err)
	}
}

// BenchmarkAWSEgressPerPacket is the cost of the AWS agent v1.5.0's
// handle_egress on one packet, with BenchmarkPolicyProgramPerPacket's
// conventions (package bpf), so that its figures compare: the same frames
// (but the SYN flag), BPF_PROG_TEST_RUN 100k runs each, the kernel's time a
// run, a ratio to an empty tc program, 1,000 peer /32 prefixes, the packet's
// peer among them, and the same metrics:
//
//   - policy-ns/pkt (also reported as ns/op): a packet decided on each run,
//     port 999, which no entry matches: the connection table has no entry
//     for it (it is emptied first) and a denied packet makes none.
//   - tracked-ns/pkt: a packet of a tracked connection, port 1023, the
//     last port entry (the first run opens the connection).
//   - opened-ns/pkt: the first packet of an allowed connection, port 1023,
//     decided and tracked: the mean of 10,000 single runs (BPF_PROG_TEST_RUN
//     with Repeat 1, the connection forgotten after each), next to the same
//     of the empty program, empty-r1-ns/pkt (the kernel's timing of a
//     single run is in it).
//
// The ring buffer of events is full, as on a node with the agent's default
// --enable-policy-event-logs=false, where nothing reads it: every event the
// program writes fails.
//
// Sub-benchmarks: np-1, a network policy port entry a prefix (the pod
// (PoliciesApplied, DefaultAllow)); np-24, 24 port entries a prefix, the
// packet's port the last; cpe, np-24 and a cluster policy entry for the
// peers' /16 with admin and baseline rules (the pod (PoliciesApplied,
// PoliciesApplied)).
func BenchmarkAWSEgressPerPacket(b *testing.B) {
	celltest.RequireRoot(b)
	empty, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer empty.Close()

	last := make([]PortRule, MaxPortEntries)
	for i := range last {
		last[i] = PortRule{Protocol: ProtocolTCP, StartPort: uint32(1000 + i)}
	}
	cpe := []ClusterRule{
		{ProtocolTCP, 100, ActionDeny, 22, 0},
		{ProtocolTCP, 200, ActionPass, 1000, 1023},
		{ProtocolUDP, 300, ActionAccept, 53, 0},
		{ProtocolTCP, BaselinePriorityOffset + 100, ActionAccept, 8080, 0},
		{ProtocolTCP, BaselinePriorityOffset + 200, ActionDeny, 1, 65535},
		{ProtocolUDP, BaselinePriorityOffset + 300, ActionAccept, 123, 0},
		{ProtocolSCTP, BaselinePriorityOffset + 400, ActionDeny, 0, 0},
	}
	for _, bc := range []struct {
		name          string
		clusterPolicy PodState
		ports         []PortRule
		cluster       []ClusterRule
	}{
		{"np-1", DefaultAllow, last[MaxPortEntries-1:], nil},
		{"np-24", DefaultAllow, last, nil},
		{"cpe", PoliciesApplied, last, cpe},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := newPeer(b)
			must(b, p.SetPodState(PoliciesApplied, bc.clusterPolicy))
			for i := range 1000 {
				cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 32)
				if i == 0 {
					cidr = netip.PrefixFrom(peer, 32)
				}
				must(b, p.AddNetworkPolicy(cidr, bc.ports))
			}
			if bc.cluster != nil {
				must(b, p.AddClusterPolicy(netip.MustParsePrefix("10.1.0.0/16"), bc.cluster))
			}
			must(b, p.FillEvents())
			must(b, p.ResetConntrack())
			benchmarkPeer(b, p, empty)
		})
	}
}

func benchmarkPeer(b *testing.B, p *Peer, empty *ebpf.Program) {
	const runs = 100_000
	const single = 10_000
	denied := frame(b, peer, 999)
	allowed := frame(b, peer, 1000+MaxPortEntries-1)
	per := func(prog *ebpf.Program, frame []byte, want uint32) float64 {
		b.Helper()
		verdict, d, err := prog.Benchmark(frame, runs, nil)
		if err != nil {
			b.Fatal(err)
		}
		if verdict != want {
			b.Fatalf("verdict %d, want %d", verdict, want)
		}
		return float64(d.Nanoseconds())
	}
	mean := func(prog *ebpf.Program, frame []byte, after func() error) float64 {
		b.Helper()
		var total int64
		for range single {
			_, d, err := prog.Benchmark(frame, 1, nil)
			if err != nil {
				b.Fatal(err)
			}
			total += d.Nanoseconds()
			if after != nil {
				must(b, after())
			}
		}
		return float64(total) / single
	}
	for b.Loop() {
		floor := per(empty, denied, VerdictOK)
		decided := per(p.Program(), denied, VerdictShot)
		tracked := per(p.Program(), allowed, VerdictOK) // the first run opens the connection
		must(b, p.Forget(allowed))
		opened := mean(p.Program(), allowed, func() error { return p.Forget(allowed) })
		floor1 := mean(empty, allowed, nil)
		b.ReportMetric(floor, "empty-ns/pkt")
		b.ReportMetric(decided, "policy-ns/pkt")
		b.ReportMetric(tracked, "tracked-ns/pkt")
		b.ReportMetric(decided/floor, "policy-x-empty")
		b.ReportMetric(tracked/floor, "tracked-x-empty")
		b.ReportMetric(opened, "opened-ns/pkt")
		b.ReportMetric(floor1, "empty-r1-ns/pkt")
		b.ReportMetric(decided, "ns/op")
	}
}

// TestPeerProgramIsTheirs: the instructions loaded are the compiled
// tc_cls section's, but for the map references of its 64-bit loads (which
// every loader fills in).
func TestPeerProgramIsTheirs(t *testing.T) {
	// The build reads the module cache and runs clang: as root, with the
	// other privileged tests (the unprivileged run has no module cache).
	celltest.RequireRoot(t)
	objs, err := build()
	if errors.Is(err, ErrMissingTools) {
		t.Skip(err)
	}
	must(t, err)
	f, err := elf.NewFile(bytes.NewReader(objs.egress))
	must(t, err)
	sec := f.Section("tc_cls")
	if sec == nil {
		t.Fatal("no tc_cls section")
	}
	raw, err := sec.Data()
	must(t, err)
	spec, err := collectionSpec(objs)
	must(t, err)
	var loaded bytes.Buffer
	must(t, spec.Programs[ProgramName].Instructions.Marshal(&loaded, binary.LittleEndian))
	got := loaded.Bytes()
	if len(got) != len(raw) {
		t.Fatalf("%d bytes of instructions loaded, the section has %d", len(got), len(raw))
	}
	maps := 0
	for off := 0; off < len(raw); off += 8 {
		in, out := raw[off:off+8], got[off:off+8]
		if in[0] == 0x18 && out[1]>>4 == 1 { // ld_imm64 of a map (BPF_PSEUDO_MAP_FD)
			if in[0] != out[0] || in[1]&0x0f != out[1]&0x0f || !bytes.Equal(raw[off+8:off+16], make([]byte, 8)) {
				t.Errorf("instruction at %d: %x loaded as %x", off, raw[off:off+16], got[off:off+16])
			}
			maps++
			off += 8
			continue
		}
		if !bytes.Equal(in, out) {
			t.Errorf("instruction at %d: %x loaded as %x", off, in, out)
		}
	}
	rel := f.Section(".rel" + sec.Name)
	if rel == nil || maps != int(rel.Size/16) {
		t.Errorf("%d map references, want one for each of the section's relocations", maps)
	}
}
