package inspect

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/enimasq/enimasq/bpf"
)

// ParseVerdictQuery parses "direction pod peer protocol [port]", e.g.
// "egress 10.0.0.5 10.1.2.3 udp 53". The port is required for TCP, UDP and
// SCTP and refused for other protocols.
func ParseVerdictQuery(args []string) (VerdictQuery, error) {
	if len(args) < 4 || len(args) > 5 {
		return VerdictQuery{}, fmt.Errorf("%q: want \"direction pod peer protocol [port]\"", strings.Join(args, " "))
	}
	var q VerdictQuery
	var err error
	if q.Direction, err = bpf.ParseDirection(args[0]); err != nil {
		return q, err
	}
	if q.Pod, err = netip.ParseAddr(args[1]); err != nil {
		return q, fmt.Errorf("pod: %w", err)
	}
	if q.Peer, err = netip.ParseAddr(args[2]); err != nil {
		return q, fmt.Errorf("peer: %w", err)
	}
	if q.Protocol, err = bpf.ParseProtocol(args[3]); err != nil {
		return q, err
	}
	switch {
	case bpf.PortKnown(q.Protocol) && len(args) != 5:
		return q, fmt.Errorf("protocol %s needs a port", args[3])
	case !bpf.PortKnown(q.Protocol) && len(args) == 5:
		return q, fmt.Errorf("protocol %s has no ports", args[3])
	case len(args) == 5:
		port, err := strconv.ParseUint(args[4], 10, 16)
		if err != nil || port == 0 {
			return q, fmt.Errorf("port %q: want 1..65535", args[4])
		}
		q.Port = uint16(port)
	}
	return q, nil
}

// VerdictQuery is a packet to judge: the pod, the peer, the direction seen
// from the pod, and the protocol and destination port.
type VerdictQuery struct {
	Direction bpf.Direction
	Pod       netip.Addr
	Peer      netip.Addr
	Protocol  uint32
	Port      uint16
}

func (q VerdictQuery) String() string {
	flow := bpf.ProtocolName(q.Protocol)
	if q.Protocol == bpf.ProtocolTCP || q.Protocol == bpf.ProtocolUDP || q.Protocol == bpf.ProtocolSCTP {
		flow = fmt.Sprintf("%s/%d", flow, q.Port)
	}
	return fmt.Sprintf("%s %s %s %s", q.Direction, q.Pod, q.Peer, flow)
}

// Verdict is what the policy program decided for a query, with the entry
// that decided.
type Verdict struct {
	Query  VerdictQuery
	Result bpf.PolicyResult
	// Map is the map the program looked in.
	Map string
	// Entry is the pod's longest matching key in Map, read from the
	// kernel; nil when the pod has none.
	Entry *KernelPolicyEntry
}

// String is one line: "ALLOW|DENY <query> by <map> <peer prefix>
// [<ports>]: <why>", or, for a pod without keys, "ALLOW <query>: no key
// for the pod in <map>: no policy selects the pod".
func (v Verdict) String() string {
	word := "DENY"
	if v.Result.Allow {
		word = "ALLOW"
	}
	if v.Entry == nil {
		return fmt.Sprintf("%s %s: no key for the pod in %s: %s", word, v.Query, v.Map, v.Result.Reason)
	}
	why := "no entry allows"
	if i := v.Result.PortEntry; i >= 0 && i < len(v.Entry.Value.Entries()) {
		why = fmt.Sprintf("entry %d (%s) allows", i, v.Entry.Value[i])
	}
	return fmt.Sprintf("%s %s by %s %s [%s]: %s", word, v.Query, v.Entry.Map, v.Entry.Peer, v.Entry.Value.String(), why)
}

// JudgePacket judges a packet made from q: it runs the policy program
// (prog) and looks up in maps (read from the kernel) the entry that decided;
// it fails if the entry and the program disagree, which would mean the maps
// changed under the run. With a nil prog (fake maps: no program can run on
// them) the entry decides alone, as the program would (c/policy.c): its
// first port entry that matches allows, none denies, and a pod without a
// matching key is allowed (no policy selects it).
func JudgePacket[M bpf.LookupMap](prog *bpf.PolicyProgram, maps map[string]M, q VerdictQuery) (Verdict, error) {
	fam := bpf.FamilyOf(q.Pod)
	if bpf.FamilyOf(q.Peer) != fam {
		return Verdict{}, fmt.Errorf("pod %s and peer %s: %w", q.Pod, q.Peer, bpf.ErrWrongFamily)
	}
	v := Verdict{Query: q, Map: bpf.PolicyMapName(q.Direction, fam)}
	if m, ok := maps[v.Map]; ok && !bpf.IsNil(m) {
		entries, err := ListPolicyMap(v.Map, m, q.Pod)
		if err != nil {
			return Verdict{}, err
		}
		for i := range entries {
			e := &entries[i]
			if e.Peer.Contains(q.Peer) && (v.Entry == nil || e.Peer.Bits() > v.Entry.Peer.Bits()) {
				v.Entry = e
			}
		}
	}
	model := bpf.PolicyResult{Allow: true, Reason: bpf.PolicyNoPolicy, PortEntry: -1}
	if v.Entry != nil {
		i := v.Entry.Value.Match(q.Protocol, q.Port, bpf.PortKnown(q.Protocol))
		model = bpf.PolicyResult{Allow: i >= 0, Reason: bpf.PolicyDenied, PortEntry: i}
		if i >= 0 {
			model.Reason = bpf.PolicyAllowed
		}
	}
	if prog == nil {
		v.Result = model
		return v, nil
	}
	src, dst := q.Pod, q.Peer
	if q.Direction == bpf.Ingress {
		src, dst = q.Peer, q.Pod
	}
	frame, err := bpf.PolicyTestFrame(src, dst, uint8(q.Protocol), 40000, q.Port)
	if err != nil {
		return Verdict{}, err
	}
	if v.Result, err = prog.Run(q.Direction, frame); err != nil {
		return Verdict{}, err
	}
	if v.Entry != nil && (v.Result.Allow != model.Allow || v.Result.PortEntry != model.PortEntry) {
		return v, fmt.Errorf("%s: the program says %+v, the pod's longest matching key %s says port entry %d: the map changed during the run?",
			q, v.Result, v.Entry, model.PortEntry)
	}
	return v, nil
}
