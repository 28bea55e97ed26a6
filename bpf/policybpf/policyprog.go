package policybpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/enimasq/enimasq/bpf"
)

// PolicyReason says why the policy programs (c/policy.c) decided as they
// did; the programs leave it in skb->cb[0].
type PolicyReason uint32

const (
	// PolicyAllowed: an interval of the pod's longest matching
	// NetworkPolicy key allows.
	PolicyAllowed PolicyReason = 1
	// PolicyDenied: the pod is isolated in the direction and no interval
	// of its longest matching NetworkPolicy key allows.
	PolicyDenied PolicyReason = 2
	// PolicyNoPolicy: no step decides (no policy selects the pod, or what
	// selects it passes): allowed, as Kubernetes allows a pod no policy
	// isolates.
	PolicyNoPolicy PolicyReason = 3
	// PolicyARP: an ARP frame, passed (the node and the pod need it).
	PolicyARP PolicyReason = 4
	// PolicyTracked: a packet of a connection the policy allowed (either
	// way).
	PolicyTracked PolicyReason = 5
	// PolicyStrict: no policy selects the pod and the mode is strict.
	PolicyStrict PolicyReason = 6
	// PolicyNeighbor: IPv6 router, neighbour or multicast listener
	// discovery (the link's own signalling), passed.
	PolicyNeighbor PolicyReason = 7
	// PolicySpoofed: what a pod sent claims an address that is not one of
	// its device's pods, or what it receives claims a local pod's address
	// and entered the node by another device.
	PolicySpoofed PolicyReason = 8
	// PolicyMalformed: a frame the programs cannot judge (VLAN-tagged, an
	// EtherType other than IPv4, IPv6 and ARP, a truncated header, more
	// IPv6 extension headers than they walk): dropped.
	PolicyMalformed PolicyReason = 9
	// PolicyFragment: a later fragment of a datagram whose first fragment
	// passed.
	PolicyFragment PolicyReason = 10
	// PolicyFragmentUnknown: a later fragment of no datagram whose first
	// fragment passed (it was denied, or has not been seen): dropped.
	PolicyFragmentUnknown PolicyReason = 11
	// PolicyAdminAccept and PolicyAdminDeny: an Admin-tier
	// ClusterPolicyEndpoint rule decides.
	PolicyAdminAccept PolicyReason = 12
	PolicyAdminDeny   PolicyReason = 13
	// PolicyBaselineAccept and PolicyBaselineDeny: a Baseline-tier rule
	// decides (the pod is not isolated by a NetworkPolicy).
	PolicyBaselineAccept PolicyReason = 14
	PolicyBaselineDeny   PolicyReason = 15
	// PolicyIncomplete: the pod's policy in force is not whole in the
	// kernel: denied, as an incomplete policy cannot be judged. A chunk
	// of its intervals is missing, its version in force has no key in a
	// map of its tier (every version the agent brings into force holds
	// the root key in each), or its first version could not be written
	// (closed).
	PolicyIncomplete PolicyReason = 16
)

// PolicyStep is the step of the evaluation that decided (skb->cb[2]).
type PolicyStep uint32

const (
	// StepNone: no step decided (a tracked connection, a frame dropped
	// before the policy, ARP, neighbour discovery).
	StepNone PolicyStep = iota
	// StepAdmin: the Admin tier of ClusterPolicyEndpoints.
	StepAdmin
	// StepNamespace: the NetworkPolicy (PolicyEndpoints).
	StepNamespace
	// StepBaseline: the Baseline tier of ClusterPolicyEndpoints.
	StepBaseline
	// StepDefault: nothing decided: allowed, denied in strict mode.
	StepDefault
)

// PolicySteps are the steps that decide, in order.
var PolicySteps = []PolicyStep{StepAdmin, StepNamespace, StepBaseline, StepDefault}

func (s PolicyStep) String() string {
	switch s {
	case StepNone:
		return "none"
	case StepAdmin:
		return "admin"
	case StepNamespace:
		return "namespace"
	case StepBaseline:
		return "baseline"
	case StepDefault:
		return "default"
	}
	return fmt.Sprintf("PolicyStep(%d)", uint32(s))
}

// ParsePolicyStep parses a step's name.
func ParsePolicyStep(s string) (PolicyStep, error) {
	for _, st := range append([]PolicyStep{StepNone}, PolicySteps...) {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("step %q: want admin, namespace, baseline, default or none", s)
}

func (r PolicyReason) String() string {
	switch r {
	case PolicyAllowed:
		return "a NetworkPolicy rule allows"
	case PolicyDenied:
		return "isolated, and no NetworkPolicy rule allows"
	case PolicyNoPolicy:
		return "no policy decides: allowed"
	case PolicyARP:
		return "ARP"
	case PolicyTracked:
		return "a connection the policy allowed"
	case PolicyStrict:
		return "no policy selects the pod (strict mode)"
	case PolicyNeighbor:
		return "IPv6 neighbour or multicast listener discovery"
	case PolicySpoofed:
		return "the source is another device's pod address"
	case PolicyMalformed:
		return "a frame the programs cannot judge (VLAN, not IP, truncated or malformed header)"
	case PolicyFragment:
		return "a later fragment of a datagram whose first fragment passed"
	case PolicyFragmentUnknown:
		return "a later fragment of no datagram whose first fragment passed"
	case PolicyAdminAccept:
		return "accepted by an Admin-tier rule"
	case PolicyAdminDeny:
		return "denied by an Admin-tier rule"
	case PolicyBaselineAccept:
		return "accepted by a Baseline-tier rule"
	case PolicyBaselineDeny:
		return "denied by a Baseline-tier rule"
	case PolicyIncomplete:
		return "the pod's policy in force is not whole in the maps (closed, or a key or chunk missing)"
	default:
		return fmt.Sprintf("PolicyReason(%d)", uint32(r))
	}
}

// ICMP protocol numbers (an echo request is a connection of its own).
const (
	protocolICMP   = 1
	protocolICMPv6 = 58
)

// tc verdicts of the policy programs: an allowed packet goes on to the
// device's next program (TC_ACT_UNSPEC, tcx's TCX_NEXT), a denied one is
// dropped.
const (
	tcActUnspec = 0xffffffff // -1
	tcActShot   = 2
)

// PolicyResult is the verdict of the policy program on one packet.
type PolicyResult struct {
	// Allow: the packet passes. With Audited, it passes only because of
	// audit mode: the policy denies it.
	Allow   bool
	Audited bool
	Reason  PolicyReason
	// Step is the step that decided.
	Step PolicyStep
	// Object is the id of the deciding object (ObjectID) when the program
	// knows it: a ClusterPolicyEndpoint's; 0 otherwise.
	Object uint32
	// Interval is the index of the deciding interval in the value of the
	// deciding map, or -1.
	Interval int
}

// skbContext is struct __sk_buff as far as BPF_PROG_TEST_RUN copies it in
// and out (192 bytes on current kernels); the program's cb[0..4] is at byte
// offset 48.
type skbContext [48]uint32

const skbCBWord = 12

// noInterval is the program's NO_INTERVAL.
const noInterval = 0xffffffff

// PolicyProgram is the pair of policy verdict programs (egress and ingress)
// bound to the four policy maps. Run it with BPF_PROG_TEST_RUN on an
// Ethernet frame.
type PolicyProgram struct {
	egress, ingress *ebpf.Program
	owned           []*ebpf.Map // placeholder maps made for missing maps
	// scratch are the placeholder connection-tracking and fragments maps,
	// emptied after each Run: without maps of tracked connections and
	// fragments given, every run is judged on the policy alone.
	scratch []*ebpf.Map
}

// LoadPolicyProgram loads the programs using the given maps, by name
// (PolicyProgramMapNames). A missing or nil policy or cluster map (a family
// disabled on the node) is replaced by an empty one of the same layout:
// every pod of that family has no policy; a missing state map by an empty
// one (no tracked connection, standard mode, events off).
func LoadPolicyProgram(maps map[string]*ebpf.Map) (*PolicyProgram, error) {
	spec, err := loadPolicy()
	if err != nil {
		return nil, fmt.Errorf("load policy program spec: %w", err)
	}
	p := &PolicyProgram{}
	replacements := map[string]*ebpf.Map{}
	for _, name := range PolicyProgramMapNames() {
		ms, ok := spec.Maps[name]
		if !ok {
			return nil, fmt.Errorf("policy program spec has no map %s", name)
		}
		m := maps[name]
		if m == nil {
			if name == PolicyCTMapName || name == PolicyFragsMapName {
				// A scratch map, emptied after each run: one entry is
				// all a run writes (and an LRU hash is preallocated).
				ms.MaxEntries = 1
			}
			if m, err = bpf.NewUnpinnedMap(ms); err != nil {
				p.Close()
				return nil, fmt.Errorf("placeholder map %s: %w", name, err)
			}
			p.owned = append(p.owned, m)
			if name == PolicyCTMapName || name == PolicyFragsMapName {
				p.scratch = append(p.scratch, m)
			}
		}
		// The map size is a flag; the program works with any.
		ms.MaxEntries = m.MaxEntries()
		replacements[name] = m
	}
	var objs policyObjects
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: replacements}); err != nil {
		p.Close()
		return nil, fmt.Errorf("load policy programs: %w", err)
	}
	p.egress, p.ingress = objs.PolicyEgress, objs.PolicyIngress
	return p, nil
}

// PolicyProgramMapNames are the maps the programs use: the policy and
// cluster maps, their chunk maps, and the state maps.
func PolicyProgramMapNames() []string {
	names := slices.Concat(PolicyMapNames, ClusterMapNames, []string{PolicyChunksMapName, ClusterChunksMapName, PolicyVersionsMapName})
	return append(names, policyStateMapNames...)
}

// Programs are the programs of the pod's egress (on the ingress of its
// host-side device) and of its ingress (on the device's egress).
func (p *PolicyProgram) Programs() (egress, ingress *ebpf.Program) { return p.egress, p.ingress }

// Run runs the program of the direction on an Ethernet frame.
func (p *PolicyProgram) Run(d Direction, frame []byte) (PolicyResult, error) {
	prog := p.egress
	if d == Ingress {
		prog = p.ingress
	} else if d != Egress {
		return PolicyResult{}, fmt.Errorf("run policy program: direction %s", d)
	}
	var in, out skbContext
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: &in, ContextOut: &out})
	if err != nil {
		return PolicyResult{}, fmt.Errorf("run policy_%s: %w", d, err)
	}
	for _, m := range p.scratch {
		if err := clearMap(m); err != nil {
			return PolicyResult{}, fmt.Errorf("run policy_%s: %w", d, err)
		}
	}
	res := PolicyResult{Reason: PolicyReason(out[skbCBWord]), Step: PolicyStep(out[skbCBWord+2]), Object: out[skbCBWord+3], Interval: -1,
		Audited: out[skbCBWord+4] == policyEventAudited}
	if idx := out[skbCBWord+1]; idx != noInterval {
		res.Interval = int(idx)
	}
	switch ret {
	case tcActUnspec:
		res.Allow = true
	case tcActShot:
	default:
		return PolicyResult{}, fmt.Errorf("run policy_%s: unexpected return code %d", d, ret)
	}
	return res, nil
}

// Close releases the programs and any placeholder maps.
func (p *PolicyProgram) Close() error {
	var errs []error
	for _, prog := range []*ebpf.Program{p.egress, p.ingress} {
		if prog != nil {
			errs = append(errs, prog.Close())
		}
	}
	for _, m := range p.owned {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}

// PolicyTestFrame builds an Ethernet frame from src to dst (same family)
// with an IP header and, for TCP, UDP and SCTP, the ports; ICMP and ICMPv6
// an echo request with srcPort as its identifier; other protocols get no
// transport header. It is what the tests and enimasq-dbg feed the
// policy program.
func PolicyTestFrame(src, dst netip.Addr, proto uint8, srcPort, dstPort uint16) ([]byte, error) {
	if bpf.FamilyOf(src) != bpf.FamilyOf(dst) {
		return nil, fmt.Errorf("frame from %s to %s: %w", src, dst, bpf.ErrWrongFamily)
	}
	var l4 []byte
	switch uint32(proto) {
	case protocolICMP:
		l4 = icmpEcho(false, srcPort)
	case protocolICMPv6:
		l4 = icmpEcho(true, srcPort)
	case ProtocolTCP:
		l4 = make([]byte, 20)
		l4[12] = 5 << 4 // data offset
	case ProtocolUDP:
		l4 = make([]byte, 8)
		binary.BigEndian.PutUint16(l4[4:], 8)
	case ProtocolSCTP:
		l4 = make([]byte, 12)
	}
	if has := uint32(proto); l4 != nil && has != protocolICMP && has != protocolICMPv6 {
		binary.BigEndian.PutUint16(l4[0:], srcPort)
		binary.BigEndian.PutUint16(l4[2:], dstPort)
	}

	frame := make([]byte, 14, 14+40+len(l4))
	if src.Is4() {
		binary.BigEndian.PutUint16(frame[12:], 0x0800)
		ip := make([]byte, 20)
		ip[0] = 0x45 // version 4, IHL 5
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		ip[8], ip[9] = 64, proto
		s, d := src.As4(), dst.As4()
		copy(ip[12:16], s[:])
		copy(ip[16:20], d[:])
		frame = append(frame, ip...)
	} else {
		binary.BigEndian.PutUint16(frame[12:], 0x86dd)
		ip := make([]byte, 40)
		ip[0] = 0x60 // version 6
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6], ip[7] = proto, 64
		s, d := src.As16(), dst.As16()
		copy(ip[8:24], s[:])
		copy(ip[24:40], d[:])
		frame = append(frame, ip...)
	}
	return append(frame, l4...), nil
}
