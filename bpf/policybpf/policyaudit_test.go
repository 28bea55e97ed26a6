package policybpf

import (
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/enimasq/enimasq/cells/celltest"
)

// TestPrivilegedPolicyAuditMode runs the real programs in audit mode
// (PolicyModeAudit, with events and a connection-tracking map): a packet
// the policy denies passes, with the step, reason and object it was denied
// by, counted in the audit counter of its direction and step (not the
// deny one), reported as an audited event, and not tracked, so that the
// next packet of the flow is judged and counted again; an allowed packet
// is as without audit; a drop before the policy stays a drop. With the
// mode off again, the same packets are denied at once.
func TestPrivilegedPolicyAuditMode(t *testing.T) {
	celltest.RequireRoot(t)
	maps := newProgramMaps(t, PolicyVerdictsMapName, PolicyEventsMapName, PolicyModeMapName, PolicyCTMapName)
	put := func(mapName, pod, peer string, v *PolicyValue) { t.Helper(); putPolicy(t, maps, mapName, pod, peer, v) }
	const (
		pod      = "10.0.0.5" // egress isolated: udp/53 to 10.0.0.0/8; Admin denies 10.9.0.0/16
		pod6     = "2001:db8::5"
		adminObj = 77
	)
	put(PolicyEgressV4MapName, pod, "0.0.0.0/0", AllowValue())
	put(PolicyEgressV4MapName, pod, "10.0.0.0/8", AllowValue(PortEntry{Protocol: ProtocolUDP, StartPort: 53}))
	put(ClusterEgressV4MapName, pod, "10.9.0.0/16", &PolicyValue{Intervals: []Interval{{Lo: 0, Hi: PortSpaceEnd, First: NewOutcome(ActionDeny, adminObj)}}})
	put(PolicyIngressV6MapName, pod6, "::/0", AllowValue()) // ingress isolated, nothing allowed

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
	if err := SetPolicyMode(maps[PolicyModeMapName], PolicyModeStandard|PolicyModeEvents|PolicyModeAudit); err != nil {
		t.Fatal(err)
	}

	type packet struct {
		dir      Direction
		src, dst string
		proto    uint32
		port     uint16
		denied   bool // by the policy
		step     PolicyStep
		reason   PolicyReason
		object   uint32
	}
	packets := []packet{
		{Egress, pod, "10.1.2.3", ProtocolTCP, 80, true, StepNamespace, PolicyDenied, 0},
		{Egress, pod, "10.9.1.1", ProtocolUDP, 53, true, StepAdmin, PolicyAdminDeny, adminObj},
		{Ingress, "2001:db8::9", pod6, ProtocolTCP, 443, true, StepNamespace, PolicyDenied, 0},
		{Egress, pod, "10.1.2.3", ProtocolUDP, 53, false, StepNamespace, PolicyAllowed, 0},
	}
	before, err := ReadPolicyVerdicts(maps[PolicyVerdictsMapName])
	if err != nil {
		t.Fatal(err)
	}
	var want [PolicyVerdictCounters]uint64
	var wantEvents []PolicyEvent
	const times = 3
	for _, p := range packets {
		src, dst := netip.MustParseAddr(p.src), netip.MustParseAddr(p.dst)
		frame, err := PolicyTestFrame(src, dst, uint8(p.proto), 40000, p.port)
		if err != nil {
			t.Fatal(err)
		}
		for i := range times {
			res, err := prog.Run(p.dir, frame)
			if err != nil {
				t.Fatal(err)
			}
			wantStep, wantReason := p.step, p.reason
			if !p.denied && i > 0 {
				wantStep, wantReason = StepNone, PolicyTracked // allowed, then tracked
			}
			if !res.Allow || res.Audited != p.denied || res.Step != wantStep || res.Reason != wantReason || res.Object != p.object {
				t.Fatalf("%s %s -> %s %s/%d, packet %d: %+v, want passed, audited=%v, step %s reason %s object %d",
					p.dir, p.src, p.dst, ProtocolName(p.proto), p.port, i, res, p.denied, wantStep, wantReason, p.object)
			}
		}
		if p.denied {
			want[AuditCounterIndex(p.dir == Egress, p.step)] += times
			e := PolicyEvent{Src: src, Dst: dst, Object: p.object, Protocol: uint8(p.proto), Direction: p.dir,
				Step: p.step, Reason: p.reason, SrcPort: 40000, DstPort: p.port, Audited: true}
			for range times {
				wantEvents = append(wantEvents, e)
			}
		} else {
			want[VerdictCounterIndex(p.dir == Egress, false, p.step)]++ // the first: the others are tracked
		}
	}
	// A drop before the policy stays a drop, reported, not audited.
	if res, err := prog.Run(Egress, make([]byte, 64)); err != nil || res.Allow || res.Audited || res.Reason != PolicyMalformed {
		t.Fatalf("EtherType 0 frame in audit mode: %+v %v", res, err)
	}
	wantEvents = append(wantEvents, PolicyEvent{Direction: Egress, Reason: PolicyMalformed})

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
	// Only the allowed flow is tracked.
	if n, err := PolicyConnections(maps[PolicyCTMapName]); err != nil || n != 1 {
		t.Errorf("%d tracked connections (%v), want 1: an audited packet opens none", n, err)
	}
	got := readEvents(t, rd, len(wantEvents))
	if len(got) != len(wantEvents) {
		t.Fatalf("%d events, want %d:\n%v", len(got), len(wantEvents), got)
	}
	for i, e := range got {
		w := wantEvents[i]
		w.Ifindex = e.Ifindex // the test run's device
		if e != w {
			t.Errorf("event %d: %+v, want %+v", i, e, w)
		}
	}

	// Audit off: the same packets are denied at once.
	if err := SetPolicyMode(maps[PolicyModeMapName], PolicyModeStandard); err != nil {
		t.Fatal(err)
	}
	for _, p := range packets[:3] {
		frame, _ := PolicyTestFrame(netip.MustParseAddr(p.src), netip.MustParseAddr(p.dst), uint8(p.proto), 40000, p.port)
		if res, err := prog.Run(p.dir, frame); err != nil || res.Allow || res.Audited || res.Reason != p.reason {
			t.Errorf("audit off: %s %s -> %s: %+v %v, want denied (%s)", p.dir, p.src, p.dst, res, err, p.reason)
		}
	}
}

// readEvents reads the ring buffer's events until n have come or none
// comes for a second, and the rest without waiting.
func readEvents(t *testing.T, rd *ringbuf.Reader, n int) []PolicyEvent {
	t.Helper()
	rd.SetDeadline(time.Now().Add(time.Second))
	var got []PolicyEvent
	for {
		rec, err := rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		e, err := ParsePolicyEvent(rec.RawSample)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
		if len(got) == n {
			rd.SetDeadline(time.Now())
		}
	}
}
