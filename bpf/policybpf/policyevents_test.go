package policybpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/celltest"
)

// eventBytes is a struct policy_event written field by field, as the C
// code lays it out.
func eventBytes(src, dst []byte, ifindex, object uint32, sport, dport uint16, family, proto, egress, step uint8, reason uint32) []byte {
	b := make([]byte, PolicyEventSize)
	copy(b[0:16], src)
	copy(b[16:32], dst)
	binary.NativeEndian.PutUint32(b[32:], ifindex)
	binary.NativeEndian.PutUint32(b[36:], object)
	binary.NativeEndian.PutUint16(b[40:], sport)
	binary.NativeEndian.PutUint16(b[42:], dport)
	b[44], b[45], b[46], b[47] = family, proto, egress, step
	binary.NativeEndian.PutUint32(b[48:], reason)
	return b
}

func TestParsePolicyEvent(t *testing.T) {
	v4 := eventBytes([]byte{10, 0, 0, 5}, []byte{10, 1, 2, 3}, 42, 7, 40000, 443, 4, 6, 1, uint8(StepNamespace), uint32(PolicyDenied))
	e, err := ParsePolicyEvent(v4)
	if err != nil {
		t.Fatal(err)
	}
	want := PolicyEvent{
		Src: netip.MustParseAddr("10.0.0.5"), Dst: netip.MustParseAddr("10.1.2.3"),
		Ifindex: 42, Object: 7, SrcPort: 40000, DstPort: 443, Protocol: 6,
		Direction: Egress, Step: StepNamespace, Reason: PolicyDenied,
	}
	if e != want {
		t.Fatalf("%+v, want %+v", e, want)
	}
	if e.Pod() != want.Src || e.Peer() != want.Dst || e.PodPort() != 40000 || e.PeerPort() != 443 || e.Family() != bpf.IPv4 {
		t.Errorf("egress: pod %s:%d peer %s:%d %s", e.Pod(), e.PodPort(), e.Peer(), e.PeerPort(), e.Family())
	}
	if b, err := e.MarshalBinary(); err != nil || !bytes.Equal(b, v4) {
		t.Errorf("MarshalBinary: %x %v, want %x", b, err, v4)
	}
	audited := slices.Clone(v4)
	binary.NativeEndian.PutUint32(audited[52:], 1)
	if a, err := ParsePolicyEvent(audited); err != nil || !a.Audited || a.Reason != PolicyDenied {
		t.Errorf("an audited event: %+v %v", a, err)
	} else if b, err := a.MarshalBinary(); err != nil || !bytes.Equal(b, audited) {
		t.Errorf("MarshalBinary of an audited event: %x %v, want %x", b, err, audited)
	}
	if s := e.String(); !strings.Contains(s, "egress 10.0.0.5 -> 10.1.2.3 tcp 40000->443") || !strings.Contains(s, "step namespace") {
		t.Errorf("String: %s", s)
	}

	src6, dst6 := netip.MustParseAddr("2001:db8::9"), netip.MustParseAddr("2001:db8::5")
	s16, d16 := src6.As16(), dst6.As16()
	v6 := eventBytes(s16[:], d16[:], 3, 0, 0, 0, 6, 58, 0, uint8(StepAdmin), uint32(PolicyAdminDeny))
	e, err = ParsePolicyEvent(v6)
	if err != nil {
		t.Fatal(err)
	}
	if e.Direction != Ingress || e.Pod() != dst6 || e.Peer() != src6 || e.Protocol != 58 || e.Step != StepAdmin || e.Reason != PolicyAdminDeny || e.Family() != bpf.IPv6 {
		t.Errorf("ingress v6: %+v", e)
	}
	if e.PodPort() != 0 || e.PeerPort() != 0 {
		t.Errorf("ports of a packet without: %d %d", e.PodPort(), e.PeerPort())
	}

	for _, tc := range []struct {
		b    []byte
		want string
	}{
		{v4[:52], "of 52 bytes, want 56"}, // an older program's event
		{append(v4[:56:56], 0, 0, 0, 0), "of 60 bytes, want 56"},
		{func() []byte { b := slices.Clone(v4); b[52] = 2; return b }(), "flags 0x2, want 0 or 0x1"},
		{nil, "of 0 bytes"},
		{eventBytes(nil, nil, 0, 0, 0, 0, 5, 6, 1, 1, 2), "family 5, want 4, 6 or 0"},
		{eventBytes(nil, nil, 0, 0, 0, 0, 4, 6, 2, 1, 2), "egress=2"},
	} {
		if _, err := ParsePolicyEvent(tc.b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePolicyEvent(%x): %v, want an error with %q", tc.b, err, tc.want)
		}
	}
	if _, err := (PolicyEvent{Src: netip.MustParseAddr("10.0.0.1"), Dst: dst6, Direction: Egress}).MarshalBinary(); !errors.Is(err, bpf.ErrWrongFamily) {
		t.Errorf("MarshalBinary of mixed families: %v", err)
	}

	// A frame that is not IP (dropped as malformed): family 0, no
	// addresses.
	e, err = ParsePolicyEvent(eventBytes(nil, nil, 9, 0, 0, 0, 0, 0, 1, 0, uint32(PolicyMalformed)))
	if err != nil {
		t.Fatal(err)
	}
	if e.Src.IsValid() || e.Dst.IsValid() || e.Pod().IsValid() || e.Family() != 0 || e.Step != StepNone || e.Reason != PolicyMalformed || e.Ifindex != 9 {
		t.Errorf("not IP: %+v", e)
	}
}

func TestVerdictCounterIndex(t *testing.T) {
	seen := map[uint32]bool{}
	for _, egress := range []bool{false, true} {
		for _, deny := range []bool{false, true} {
			for _, step := range PolicySteps {
				i := VerdictCounterIndex(egress, deny, step)
				want := uint32(step) - 1
				if egress {
					want += 8
				}
				if deny {
					want += 4
				}
				if i != want || seen[i] {
					t.Errorf("VerdictCounterIndex(%v, %v, %s) = %d, want %d once", egress, deny, step, i, want)
				}
				seen[i] = true
				verdict := VerdictAllow
				if deny {
					verdict = VerdictDeny
				}
				if e, v, s := VerdictCounterOf(i); e != egress || v != verdict || s != step {
					t.Errorf("VerdictCounterOf(%d) = %v %s %s", i, e, v, s)
				}
			}
		}
		for _, step := range PolicySteps {
			i := AuditCounterIndex(egress, step)
			want := 16 + uint32(step) - 1
			if egress {
				want += 4
			}
			if i != want || seen[i] {
				t.Errorf("AuditCounterIndex(%v, %s) = %d, want %d once", egress, step, i, want)
			}
			seen[i] = true
			if e, v, s := VerdictCounterOf(i); e != egress || v != VerdictAudit || s != step {
				t.Errorf("VerdictCounterOf(%d) = %v %s %s", i, e, v, s)
			}
		}
	}
	if len(seen) != PolicyVerdictCounters {
		t.Errorf("%d counters, want %d", len(seen), PolicyVerdictCounters)
	}
}

func FuzzParsePolicyEvent(f *testing.F) {
	f.Add(eventBytes([]byte{10, 0, 0, 5}, []byte{10, 1, 2, 3}, 42, 7, 40000, 443, 4, 6, 1, 2, 2))
	f.Add(eventBytes(bytes.Repeat([]byte{0x20}, 16), bytes.Repeat([]byte{1}, 16), 3, 0, 0, 0, 6, 58, 0, 1, 13))
	f.Add(eventBytes(nil, nil, 0, 0, 0, 0, 4, 0, 0, 0, 9))
	f.Add([]byte{})
	f.Add(make([]byte, 56))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := ParsePolicyEvent(b)
		if err != nil {
			if len(b) != PolicyEventSize || b[44] != 0 && b[44] != 4 && b[44] != 6 || b[46] > 1 {
				return
			}
			t.Fatalf("ParsePolicyEvent(%x): %v", b, err)
		}
		if len(b) != PolicyEventSize {
			t.Fatalf("ParsePolicyEvent accepted %d bytes", len(b))
		}
		out, err := e.MarshalBinary()
		if err != nil {
			t.Fatalf("MarshalBinary(%+v): %v", e, err)
		}
		again, err := ParsePolicyEvent(out)
		if err != nil || again != e {
			t.Fatalf("round trip of %+v: %+v %v", e, again, err)
		}
		// The bytes come back but the unused ones of an IPv4 address.
		want := bytes.Clone(b)
		switch b[44] {
		case 4:
			clear(want[4:16])
			clear(want[20:32])
		case 0:
			clear(want[0:32])
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("MarshalBinary(ParsePolicyEvent(%x)) = %x", b, out)
		}
		if e.Pod() == e.Peer() && e.Src != e.Dst {
			t.Fatalf("pod and peer of %+v", e)
		}
		_ = e.String()
	})
}

// TestPrivilegedPolicyVerdictsAndEvents runs the real programs with the
// verdict counters, the events ring buffer and the mode (events on): each
// decision counts once in the counter of its direction, verdict and step,
// and the ring buffer holds exactly the packets dropped.
func TestPrivilegedPolicyVerdictsAndEvents(t *testing.T) {
	celltest.RequireRoot(t)
	maps := newProgramMaps(t, PolicyVerdictsMapName, PolicyEventsMapName, PolicyModeMapName)
	if err := SetPolicyMode(maps[PolicyModeMapName], PolicyModeStandard|PolicyModeEvents); err != nil {
		t.Fatal(err)
	}
	put := func(mapName, pod, peer string, v *PolicyValue) { t.Helper(); putPolicy(t, maps, mapName, pod, peer, v) }
	const (
		pod4     = "10.0.0.5" // NetworkPolicy: egress udp/53 to 10.0.0.0/8; Admin denies 10.9.0.0/16
		podBase  = "10.0.0.7" // Baseline: denies egress tcp to 10.8.0.0/16, accepts ingress from anywhere
		pod6     = "2001:db8::5"
		adminObj = 77
		baseObj  = 88
	)
	put(PolicyEgressV4MapName, pod4, "0.0.0.0/0", AllowValue()) // isolated
	put(PolicyEgressV4MapName, pod4, "10.0.0.0/8", AllowValue(PortEntry{Protocol: ProtocolUDP, StartPort: 53}))
	put(ClusterEgressV4MapName, pod4, "10.9.0.0/16", &PolicyValue{Intervals: []Interval{{Lo: 0, Hi: PortSpaceEnd, First: NewOutcome(ActionDeny, adminObj)}}})
	put(ClusterEgressV4MapName, podBase, "10.8.0.0/16", &PolicyValue{Intervals: []Interval{
		{Lo: ProtocolTCP << 16, Hi: ProtocolTCP<<16 | 0xffff, Second: NewOutcome(ActionDeny, baseObj)}}})
	put(ClusterIngressV4MapName, podBase, "0.0.0.0/0", &PolicyValue{Intervals: []Interval{{Lo: 0, Hi: PortSpaceEnd, Second: NewOutcome(ActionAccept, baseObj)}}})
	put(PolicyIngressV6MapName, pod6, "::/0", AllowValue(PortEntry{Protocol: ProtocolTCP, StartPort: 443}))

	prog, err := LoadPolicyProgram(maps)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	rd, err := ringbuf.NewReader(maps[PolicyEventsMapName])
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()

	before, err := ReadPolicyVerdicts(maps[PolicyVerdictsMapName])
	if err != nil {
		t.Fatal(err)
	}
	type packet struct {
		dir      Direction
		src, dst string
		proto    uint32
		port     uint16
		allow    bool
		step     PolicyStep
		reason   PolicyReason
		object   uint32
		times    int
	}
	packets := []packet{
		{Egress, pod4, "10.1.2.3", ProtocolUDP, 53, true, StepNamespace, PolicyAllowed, 0, 3},
		{Egress, pod4, "10.1.2.3", ProtocolTCP, 80, false, StepNamespace, PolicyDenied, 0, 2},
		{Egress, pod4, "10.9.1.1", ProtocolUDP, 53, false, StepAdmin, PolicyAdminDeny, adminObj, 1},
		{Egress, pod4, "8.8.8.8", ProtocolTCP, 443, false, StepNamespace, PolicyDenied, 0, 1},
		{Egress, podBase, "10.8.0.1", ProtocolTCP, 22, false, StepBaseline, PolicyBaselineDeny, baseObj, 2},
		{Egress, podBase, "10.8.0.1", ProtocolUDP, 22, true, StepDefault, PolicyNoPolicy, 0, 1},
		{Ingress, "10.200.0.1", podBase, ProtocolTCP, 8080, true, StepBaseline, PolicyBaselineAccept, baseObj, 4},
		{Ingress, "2001:db8::9", pod6, ProtocolTCP, 443, true, StepNamespace, PolicyAllowed, 0, 1},
		{Ingress, "2001:db8::9", pod6, ProtocolTCP, 80, false, StepNamespace, PolicyDenied, 0, 2},
		{Ingress, "2001:db8::9", pod6, 58, 0, false, StepNamespace, PolicyDenied, 0, 1},
		{Ingress, "10.1.1.1", "10.0.0.99", ProtocolTCP, 80, true, StepDefault, PolicyNoPolicy, 0, 1},
	}
	var want [PolicyVerdictCounters]uint64
	var wantEvents []PolicyEvent
	for _, p := range packets {
		src, dst := netip.MustParseAddr(p.src), netip.MustParseAddr(p.dst)
		frame, err := PolicyTestFrame(src, dst, uint8(p.proto), 40000, p.port)
		if err != nil {
			t.Fatal(err)
		}
		for range p.times {
			res, err := prog.Run(p.dir, frame)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allow != p.allow || res.Step != p.step || res.Reason != p.reason || res.Object != p.object {
				t.Fatalf("%s %s -> %s %s/%d: %+v, want allow=%v step %s reason %s object %d",
					p.dir, p.src, p.dst, ProtocolName(p.proto), p.port, res, p.allow, p.step, p.reason, p.object)
			}
		}
		want[VerdictCounterIndex(p.dir == Egress, !p.allow, p.step)] += uint64(p.times)
		if !p.allow {
			e := PolicyEvent{Src: src, Dst: dst, Object: p.object, Protocol: uint8(p.proto), Direction: p.dir, Step: p.step, Reason: p.reason}
			if p.proto != 58 {
				e.SrcPort, e.DstPort = 40000, p.port
			}
			for range p.times {
				wantEvents = append(wantEvents, e)
			}
		}
	}
	// Not counted, but a drop before the policy is an event: a frame of
	// an EtherType the programs do not judge, and ARP (passed, neither).
	if res, err := prog.Run(Egress, make([]byte, 64)); err != nil || res.Allow || res.Reason != PolicyMalformed || res.Step != StepNone {
		t.Fatalf("EtherType 0 frame: %+v %v", res, err)
	}
	wantEvents = append(wantEvents, PolicyEvent{Direction: Egress, Reason: PolicyMalformed})
	arp := make([]byte, 42)
	arp[12], arp[13] = 0x08, 0x06
	if res, err := prog.Run(Ingress, arp); err != nil || !res.Allow || res.Reason != PolicyARP {
		t.Fatalf("ARP frame: %+v %v", res, err)
	}

	after, err := ReadPolicyVerdicts(maps[PolicyVerdictsMapName])
	if err != nil {
		t.Fatal(err)
	}
	for i := range after {
		if got := after[i] - before[i]; got != want[i] {
			egress, v, step := VerdictCounterOf(uint32(i))
			t.Errorf("counter %d (egress=%v %s %s): grew by %d, want %d", i, egress, v, step, got, want[i])
		}
	}

	got := readEvents(t, rd, len(wantEvents))
	if len(got) != len(wantEvents) {
		t.Fatalf("%d events, want %d:\n%v", len(got), len(wantEvents), got)
	}
	for i, e := range got {
		w := wantEvents[i]
		if e.Ifindex == 0 {
			t.Errorf("event %d: no ifindex: %+v", i, e)
		}
		w.Ifindex = e.Ifindex // the test run's device
		if e != w {
			t.Errorf("event %d: %+v, want %+v", i, e, w)
		}
	}

	// Events off: the counters count, the ring buffer stays empty.
	if err := SetPolicyMode(maps[PolicyModeMapName], PolicyModeStandard); err != nil {
		t.Fatal(err)
	}
	frame, _ := PolicyTestFrame(netip.MustParseAddr(pod4), netip.MustParseAddr("10.1.2.3"), uint8(ProtocolTCP), 1, 80)
	if res, err := prog.Run(Egress, frame); err != nil || res.Allow {
		t.Fatalf("%+v %v", res, err)
	}
	rd.SetDeadline(time.Now().Add(100 * time.Millisecond))
	if rec, err := rd.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("events off: %x %v, want no event", rec.RawSample, err)
	}
	last, err := ReadPolicyVerdicts(maps[PolicyVerdictsMapName])
	if err != nil {
		t.Fatal(err)
	}
	if i := VerdictCounterIndex(true, true, StepNamespace); last[i] != after[i]+1 {
		t.Errorf("events off: counter %d %d -> %d, want one more", i, after[i], last[i])
	}
	if _, err := ReadPolicyVerdicts(maps[PolicyModeMapName]); err == nil || !strings.Contains(err.Error(), "per-CPU array") {
		t.Errorf("ReadPolicyVerdicts of the mode map: %v", err)
	}
}
