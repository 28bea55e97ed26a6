package policybpf

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/enimasq/enimasq/bpf"
)

// The policy programs' observations (c/policy.c): every decision counts in
// the per-CPU array enimasq_policy_verdicts (PolicyVerdictsMapName), by
// direction, verdict and step; with events on (PolicyModeEvents), every
// packet they drop is reported in the ring buffer enimasq_policy_events
// (PolicyEventsMapName) as a struct policy_event.
//
// Not counted: the packets of a connection already allowed (PolicyTracked),
// ARP, neighbour discovery and the drops before the policy (spoofed,
// malformed, unknown fragments). Those drops are reported as events, with
// step StepNone.

// PolicyVerdictCounters is the number of counters of the verdicts map:
// direction (2) x verdict (2) x step (4), then the denials audit mode
// passed (PolicyModeAudit): direction (2) x step (4).
const PolicyVerdictCounters = 24

// Verdict is what a counter counts: an allowed packet, a denied one, or
// one the policy denied and audit mode passed.
type Verdict uint8

const (
	VerdictAllow Verdict = iota
	VerdictDeny
	VerdictAudit
)

// String is the verdict as the metrics label it: allow, deny, audit (as
// Hubble's AUDIT verdict: denied by the policy, passed by audit mode).
func (v Verdict) String() string {
	switch v {
	case VerdictAllow:
		return "allow"
	case VerdictDeny:
		return "deny"
	case VerdictAudit:
		return "audit"
	}
	return fmt.Sprintf("verdict(%d)", uint8(v))
}

// VerdictCounterIndex is the index of the counter of a decision in the
// verdicts map, as the programs compute it: (egress ? 8 : 0) + (deny ? 4 :
// 0) + step - 1. step is one of PolicySteps (another is folded into them,
// as the programs do).
func VerdictCounterIndex(egress, deny bool, step PolicyStep) uint32 {
	var i uint32
	if egress {
		i += 8
	}
	if deny {
		i += 4
	}
	return i + (uint32(step)-1)&3
}

// AuditCounterIndex is the index of the counter of a packet the policy
// denied at step and audit mode passed: 16 + (egress ? 4 : 0) + step - 1.
func AuditCounterIndex(egress bool, step PolicyStep) uint32 {
	var i uint32 = 16
	if egress {
		i += 4
	}
	return i + (uint32(step)-1)&3
}

// VerdictCounterOf is the decision a counter index counts: the inverse of
// VerdictCounterIndex and AuditCounterIndex for 0..PolicyVerdictCounters-1.
func VerdictCounterOf(i uint32) (egress bool, v Verdict, step PolicyStep) {
	if i >= 16 {
		return i&4 != 0, VerdictAudit, PolicyStep(i&3 + 1)
	}
	v = VerdictAllow
	if i&4 != 0 {
		v = VerdictDeny
	}
	return i&8 != 0, v, PolicyStep(i&3 + 1)
}

// ReadPolicyVerdicts reads the counters of a verdicts map, each summed
// over the CPUs, by VerdictCounterIndex.
func ReadPolicyVerdicts(m *ebpf.Map) ([PolicyVerdictCounters]uint64, error) {
	var out [PolicyVerdictCounters]uint64
	if m.Type() != ebpf.PerCPUArray || m.KeySize() != 4 || m.ValueSize() != 8 || m.MaxEntries() < PolicyVerdictCounters {
		return out, fmt.Errorf("read the policy verdicts: the map is a %s key=%d value=%d max=%d, want a per-CPU array key=4 value=8 max=%d",
			m.Type(), m.KeySize(), m.ValueSize(), m.MaxEntries(), PolicyVerdictCounters)
	}
	var perCPU []uint64
	for i := range uint32(PolicyVerdictCounters) {
		if err := m.Lookup(i, &perCPU); err != nil {
			return out, fmt.Errorf("read the policy verdicts: counter %d: %w", i, err)
		}
		for _, n := range perCPU {
			out[i] += n
		}
	}
	return out, nil
}

// PolicyEventSize is the size of struct policy_event (no padding: its
// fields end on a 4-byte boundary).
const PolicyEventSize = 56

// policyEventAudited is struct policy_event's flag (AUDITED): the policy
// denied the packet and audit mode passed it.
const policyEventAudited = 1

// PolicyEvent is a packet the policy programs dropped, as the events ring
// buffer reports it (struct policy_event).
type PolicyEvent struct {
	// Src and Dst are the packet's addresses: on egress the pod is Src,
	// on ingress Dst. Both are the zero Addr for a frame that is not IP
	// (family 0: dropped as malformed before its addresses were read).
	Src, Dst netip.Addr
	// Ifindex is the pod's host-side device.
	Ifindex uint32
	// Object is the id of the deciding object (ObjectID), 0 when the agent
	// names it from its tables.
	Object uint32
	// SrcPort and DstPort are 0 for a packet without ports.
	SrcPort, DstPort uint16
	Protocol         uint8
	// Direction is Egress (the pod sent it) or Ingress (it receives it).
	Direction Direction
	// Step is the step that decided; StepNone for a drop before the
	// policy (spoofed, malformed, a fragment).
	Step   PolicyStep
	Reason PolicyReason
	// Audited: the policy denied the packet and audit mode
	// (PolicyModeAudit) passed it.
	Audited bool
}

// ParsePolicyEvent decodes a struct policy_event: 56 bytes, in host byte
// order but the addresses.
func ParsePolicyEvent(b []byte) (PolicyEvent, error) {
	if len(b) != PolicyEventSize {
		return PolicyEvent{}, fmt.Errorf("policy event of %d bytes, want %d (another version of the programs?)", len(b), PolicyEventSize)
	}
	e := PolicyEvent{
		Ifindex:  binary.NativeEndian.Uint32(b[32:]),
		Object:   binary.NativeEndian.Uint32(b[36:]),
		SrcPort:  binary.NativeEndian.Uint16(b[40:]),
		DstPort:  binary.NativeEndian.Uint16(b[42:]),
		Protocol: b[45],
		Step:     PolicyStep(b[47]),
		Reason:   PolicyReason(binary.NativeEndian.Uint32(b[48:])),
	}
	switch flags := binary.NativeEndian.Uint32(b[52:]); flags {
	case 0:
	case policyEventAudited:
		e.Audited = true
	default:
		return PolicyEvent{}, fmt.Errorf("policy event with flags %#x, want 0 or %#x (audited)", flags, policyEventAudited)
	}
	switch b[44] {
	case 4:
		e.Src, e.Dst = netip.AddrFrom4([4]byte(b[0:4])), netip.AddrFrom4([4]byte(b[16:20]))
	case 6:
		e.Src, e.Dst = netip.AddrFrom16([16]byte(b[0:16])), netip.AddrFrom16([16]byte(b[16:32]))
	case 0:
		// Not IP: no addresses.
	default:
		return PolicyEvent{}, fmt.Errorf("policy event of family %d, want 4, 6 or 0 (not IP)", b[44])
	}
	switch b[46] {
	case 1:
		e.Direction = Egress
	case 0:
		e.Direction = Ingress
	default:
		return PolicyEvent{}, fmt.Errorf("policy event with egress=%d, want 0 or 1", b[46])
	}
	return e, nil
}

// MarshalBinary encodes the event as the programs write it (what
// ParsePolicyEvent reads).
func (e PolicyEvent) MarshalBinary() ([]byte, error) {
	b := make([]byte, PolicyEventSize)
	switch {
	case e.Src.Is4() && e.Dst.Is4():
		b[44] = 4
		s, d := e.Src.As4(), e.Dst.As4()
		copy(b[0:], s[:])
		copy(b[16:], d[:])
	case e.Src.Is6() && e.Dst.Is6():
		b[44] = 6
		s, d := e.Src.As16(), e.Dst.As16()
		copy(b[0:], s[:])
		copy(b[16:], d[:])
	case !e.Src.IsValid() && !e.Dst.IsValid():
		// Family 0: not IP.
	default:
		return nil, fmt.Errorf("policy event from %s to %s: %w", e.Src, e.Dst, bpf.ErrWrongFamily)
	}
	switch e.Direction {
	case Egress:
		b[46] = 1
	case Ingress:
	default:
		return nil, fmt.Errorf("policy event: direction %s", e.Direction)
	}
	if e.Step > 0xff {
		return nil, fmt.Errorf("policy event: step %d", e.Step)
	}
	binary.NativeEndian.PutUint32(b[32:], e.Ifindex)
	binary.NativeEndian.PutUint32(b[36:], e.Object)
	binary.NativeEndian.PutUint16(b[40:], e.SrcPort)
	binary.NativeEndian.PutUint16(b[42:], e.DstPort)
	b[45] = e.Protocol
	b[47] = uint8(e.Step)
	binary.NativeEndian.PutUint32(b[48:], uint32(e.Reason))
	if e.Audited {
		binary.NativeEndian.PutUint32(b[52:], policyEventAudited)
	}
	return b, nil
}

// Pod is the pod's address: the source on egress, the destination on
// ingress.
func (e PolicyEvent) Pod() netip.Addr {
	if e.Direction == Egress {
		return e.Src
	}
	return e.Dst
}

// Peer is the other end's address.
func (e PolicyEvent) Peer() netip.Addr {
	if e.Direction == Egress {
		return e.Dst
	}
	return e.Src
}

// PodPort and PeerPort are the ports of the pod's and the peer's ends (0
// for a packet without ports).
func (e PolicyEvent) PodPort() uint16 {
	if e.Direction == Egress {
		return e.SrcPort
	}
	return e.DstPort
}

func (e PolicyEvent) PeerPort() uint16 {
	if e.Direction == Egress {
		return e.DstPort
	}
	return e.SrcPort
}

// Family is the family of the event's addresses, 0 for a frame that is
// not IP.
func (e PolicyEvent) Family() bpf.Family {
	if !e.Src.IsValid() {
		return 0
	}
	return bpf.FamilyOf(e.Src)
}

func (e PolicyEvent) String() string {
	proto := ProtocolName(uint32(e.Protocol))
	ports := ""
	if e.SrcPort != 0 || e.DstPort != 0 {
		ports = fmt.Sprintf(" %d->%d", e.SrcPort, e.DstPort)
	}
	return fmt.Sprintf("%s %s -> %s %s%s ifindex %d step %s object %d: %s",
		e.Direction, e.Src, e.Dst, proto, ports, e.Ifindex, e.Step, e.Object, e.Reason)
}
