package inspect

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
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
	if q.Direction, err = policybpf.ParseDirection(args[0]); err != nil {
		return q, err
	}
	if q.Pod, err = netip.ParseAddr(args[1]); err != nil {
		return q, fmt.Errorf("pod: %w", err)
	}
	if q.Peer, err = netip.ParseAddr(args[2]); err != nil {
		return q, fmt.Errorf("peer: %w", err)
	}
	if q.Protocol, err = policybpf.ParseProtocol(args[3]); err != nil {
		return q, err
	}
	switch {
	case policybpf.PortKnown(q.Protocol) && len(args) != 5:
		return q, fmt.Errorf("protocol %s needs a port", args[3])
	case !policybpf.PortKnown(q.Protocol) && len(args) == 5:
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
	Direction policybpf.Direction
	Pod       netip.Addr
	Peer      netip.Addr
	Protocol  uint32
	Port      uint16
}

func (q VerdictQuery) String() string {
	flow := policybpf.ProtocolName(q.Protocol)
	if q.Protocol == policybpf.ProtocolTCP || q.Protocol == policybpf.ProtocolUDP || q.Protocol == policybpf.ProtocolSCTP {
		flow = fmt.Sprintf("%s/%d", flow, q.Port)
	}
	return fmt.Sprintf("%s %s %s %s", q.Direction, q.Pod, q.Peer, flow)
}

// Verdict is what the policy program decided for a query, with the keys
// it looked at.
type Verdict struct {
	Query  VerdictQuery
	Result policybpf.PolicyResult
	// Map and Cluster are the NetworkPolicy and cluster maps the program
	// looked in.
	Map, Cluster string
	// Entry and ClusterEntry are the pod's longest matching keys in Map
	// and Cluster, read from the kernel; nil when the pod has none.
	Entry, ClusterEntry *KernelPolicyEntry
	// Object names the deciding object ("ClusterPolicyEndpoint/name",
	// "PolicyEndpoint/namespace/name"), when the caller knows it.
	Object string
}

// decidingEntry is the key whose interval decided, nil for none.
func (v Verdict) decidingEntry() *KernelPolicyEntry {
	switch v.Result.Step {
	case policybpf.StepAdmin, policybpf.StepBaseline:
		return v.ClusterEntry
	case policybpf.StepNamespace:
		return v.Entry
	}
	return nil
}

// String is one line: "ALLOW|DENY <query>: <step>[ <object>]: <why>
// [<map> <peer prefix>: <ports>]", the key and interval that decided.
func (v Verdict) String() string {
	word := "DENY"
	switch {
	case v.Result.Audited:
		word = "AUDIT" // the policy denies it; audit mode passes it
	case v.Result.Allow:
		word = "ALLOW"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %s", word, v.Query, v.Result.Step)
	if v.Object != "" {
		fmt.Fprintf(&b, " %s", v.Object)
	}
	fmt.Fprintf(&b, ": %s", v.Result.Reason)
	if e := v.decidingEntry(); e != nil {
		fmt.Fprintf(&b, " [%s %s: ", e.Map, e.Peer)
		if i := v.Result.Interval; i >= 0 && i < len(e.Value.Intervals) {
			b.WriteString(policybpf.IntervalText(e.Value.Intervals[i]))
		} else {
			b.WriteString(e.Ports())
		}
		b.WriteByte(']')
	} else if v.Result.Step == policybpf.StepDefault && v.Entry == nil && v.ClusterEntry == nil {
		fmt.Fprintf(&b, " (no key for the pod in %s or %s)", v.Map, v.Cluster)
	}
	return b.String()
}

// longest is the pod's longest key of map name that holds peer.
func longest[M bpf.LookupMap](maps map[string]M, name string, q VerdictQuery) (*KernelPolicyEntry, error) {
	m := lookupIn(maps, name)
	if m == nil {
		return nil, nil
	}
	entries, err := ListPolicyMap(name, m, lookupIn(maps, ChunksOf(name)), lookupIn(maps, policybpf.PolicyVersionsMapName), q.Pod)
	if err != nil {
		return nil, err
	}
	var best *KernelPolicyEntry
	for i := range entries {
		e := &entries[i]
		if e.InForce && e.Peer.Contains(q.Peer) && (best == nil || e.Peer.Bits() > best.Peer.Bits()) {
			best = e
		}
	}
	return best, nil
}

// JudgePacket judges a packet made from q: it runs the policy program
// (prog) and looks up in maps (read from the kernel) the keys that
// decided; it fails if they and the program disagree, which would mean the
// maps changed under the run. With a nil prog (fake maps: no program can
// run on them) the keys decide alone, as the program would
// (policybpf.EvaluatePolicy, standard mode).
func JudgePacket[M bpf.LookupMap](prog *policybpf.PolicyProgram, maps map[string]M, q VerdictQuery) (Verdict, error) {
	fam := bpf.FamilyOf(q.Pod)
	if bpf.FamilyOf(q.Peer) != fam {
		return Verdict{}, fmt.Errorf("pod %s and peer %s: %w", q.Pod, q.Peer, bpf.ErrWrongFamily)
	}
	v := Verdict{Query: q, Map: policybpf.PolicyMapName(q.Direction, fam), Cluster: policybpf.ClusterMapName(q.Direction, fam)}
	var err error
	if v.Entry, err = longest(maps, v.Map, q); err != nil {
		return Verdict{}, err
	}
	if v.ClusterEntry, err = longest(maps, v.Cluster, q); err != nil {
		return Verdict{}, err
	}
	var np, cp *policybpf.PolicyValue
	if v.Entry != nil {
		np = &v.Entry.Value
	}
	if v.ClusterEntry != nil {
		cp = &v.ClusterEntry.Value
	}
	model := policybpf.EvaluatePolicy(cp, np, policybpf.PortPoint(q.Protocol, q.Port, policybpf.PortKnown(q.Protocol)), false)
	if prog == nil {
		v.Result = model
		return v, nil
	}
	src, dst := q.Pod, q.Peer
	if q.Direction == policybpf.Ingress {
		src, dst = q.Peer, q.Pod
	}
	frame, err := policybpf.PolicyTestFrame(src, dst, uint8(q.Protocol), 40000, q.Port)
	if err != nil {
		return Verdict{}, err
	}
	if v.Result, err = prog.Run(q.Direction, frame); err != nil {
		return Verdict{}, err
	}
	// The mode is the program's: compare the steps that do not depend on it.
	if v.Result.Step != policybpf.StepDefault && (v.Result.Allow != model.Allow || v.Result.Step != model.Step || v.Result.Interval != model.Interval) {
		return v, fmt.Errorf("%s: the program says %+v, the pod's longest matching keys say %+v: the maps changed during the run?",
			q, v.Result, model)
	}
	return v, nil
}
