package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/prefixorder"
)

// KernelPolicyEntry is one entry of a policy map as the kernel holds it,
// decoded. Used by the script commands and enimasq-dbg, which read the
// kernel, not the table.
type KernelPolicyEntry struct {
	Map   string
	Pod   netip.Addr
	Peer  netip.Prefix
	Value bpf.PolicyValue
}

func (e KernelPolicyEntry) String() string {
	return fmt.Sprintf("%s %s %s %s", e.Map, e.Pod, e.Peer, e.Value.String())
}

// ListPolicyMap returns the entries of the policy map name, sorted by pod
// then peer. With a valid pod, only that pod's entries.
func ListPolicyMap(name string, m bpf.LookupMap, pod netip.Addr) ([]KernelPolicyEntry, error) {
	_, fam, err := bpf.ParsePolicyMapName(name)
	if err != nil {
		return nil, err
	}
	keys, err := bpf.Keys(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var out []KernelPolicyEntry
	value := make([]byte, m.ValueSize())
	for _, key := range keys {
		p, peer, err := bpf.UnmarshalPolicyKey(fam, key)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if pod.IsValid() && p != pod {
			continue
		}
		if err := m.Lookup(key, value); errors.Is(err, ebpf.ErrKeyNotExist) {
			continue // deleted since the keys were listed
		} else if err != nil {
			return nil, fmt.Errorf("%s key %s %s: %w", name, p, peer, err)
		}
		v, err := bpf.UnmarshalPolicyValue(value)
		if err != nil {
			return nil, fmt.Errorf("%s key %s %s: %w", name, p, peer, err)
		}
		out = append(out, KernelPolicyEntry{Map: name, Pod: p, Peer: peer, Value: v})
	}
	slices.SortFunc(out, func(a, b KernelPolicyEntry) int {
		if c := a.Pod.Compare(b.Pod); c != 0 {
			return c
		}
		return prefixorder.Compare(a.Peer, b.Peer)
	})
	return out, nil
}

// ListPolicyMaps lists the given maps (by name; nil maps are skipped) in
// the order of bpf.PolicyMapNames, one "map pod peer ports" line per entry.
func ListPolicyMaps[M bpf.LookupMap](maps map[string]M, pod netip.Addr) (string, error) {
	var out strings.Builder
	for _, name := range bpf.PolicyMapNames {
		m, ok := maps[name]
		if !ok || bpf.IsNil(m) {
			continue
		}
		entries, err := ListPolicyMap(name, m, pod)
		if err != nil {
			return "", err
		}
		for _, e := range entries {
			out.WriteString(e.String())
			out.WriteByte('\n')
		}
	}
	return out.String(), nil
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
		i := v.Entry.Value.Match(q.Protocol, q.Port, portKnown(q.Protocol))
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

// portKnown reports whether packets of the protocol carry ports the
// program reads.
func portKnown(proto uint32) bool {
	return proto == bpf.ProtocolTCP || proto == bpf.ProtocolUDP || proto == bpf.ProtocolSCTP
}
