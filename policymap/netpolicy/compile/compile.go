package compile

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// CompilePod returns the map entries of a pod IP for every direction, from
// the PolicyEndpoints that select it, in the maps of the pod IP's family.
// A policy is the union of its slices (endpoints.Union): the objects in pes
// that list the pod IP and every other slice of their policies decide;
// the rest of pes is ignored. It is pure and
// deterministic: the same objects, in any order, give the same entries with
// the same bytes.
//
// Kubernetes NetworkPolicy semantics: a pod IP that no object selects gets
// no entries (everything is allowed); one that no selecting object isolates
// in a direction gets one allow-all key at the root for it. An isolated pod
// allows peer P on (protocol, port) iff some rule of that direction, in some
// selecting object that isolates that direction, has cidr ⊇ P, P outside
// all of that rule's own excepts, and lists (protocol, port). Rules are a
// union: an except only ever cuts into its own rule. The node's own IP
// (hostIP) is always allowed.
//
// Encoding: the boundary prefixes are the root (0.0.0.0/0 or ::/0), every
// cidr and every except of the pod IP's family, and the node IP. The value
// at a boundary B is the union of the ports of the rules whose cidr contains
// B and none of whose excepts contains B, sorted and merged (allow-all at
// the node IP). Prefixes either nest or are disjoint, so for any peer the
// longest boundary B that contains it is exactly as deep as needed: a rule
// covers the peer iff it covers B. A union of any size is encoded: its
// intervals past a map value's are in chunks (policybpf.PolicyValue).
//
// The entries of a pod are its selection's [policyTemplate]s stamped with
// its IP (compileSelection, stamp): pods with the same selecting objects and
// node IP share one compilation and its values.
func CompilePod(pod netip.Addr, pes []*endpoints.PolicyEndpoint) []*PolicyMapEntry {
	entry := func(pe *endpoints.PolicyEndpoint) (endpoints.PodEndpoint, bool) { return pe.PodEntry(pod) }
	sel, ok := selectionOf(pod, newObjectSet(endpoints.UnionOf(pod, pes)), pes, entry)
	if !ok {
		return nil
	}
	ts := compileSelection(sel)
	n := 0
	for _, t := range ts {
		n += t.n
	}
	out := make([]*PolicyMapEntry, 0, n)
	for _, t := range ts {
		out = stamp(t, out, pod)
	}
	return out
}

// compileSelection returns the templates of the selection, egress first.
func compileSelection(sel selection[*endpoints.PolicyEndpoint]) []*policyTemplate {
	out := make([]*policyTemplate, 0, 2)
	for _, d := range []policybpf.Direction{policybpf.Egress, policybpf.Ingress} {
		out = append(out, compileDirection(sel, d))
	}
	return out
}

// mergePorts is the union of port specs as sorted, merged entries: per
// protocol (in protocol number order), every port if any spec says so,
// otherwise the ranges merged where they overlap or touch. It is the
// reference for portCover.
func mergePorts(out []policybpf.PortEntry, ports []endpoints.Port) []policybpf.PortEntry {
	if len(ports) == 0 {
		return out
	}
	type span struct {
		proto      uint32
		start, end uint32 // start 0: every port
	}
	spans := make([]span, 0, len(ports))
	for _, p := range ports {
		s := span{proto: p.Protocol, start: uint32(p.Port), end: uint32(p.Port)}
		if p.EndPort != 0 {
			s.end = uint32(p.EndPort)
		}
		spans = append(spans, s)
	}
	slices.SortFunc(spans, func(a, b span) int {
		if c := cmp.Compare(a.proto, b.proto); c != 0 {
			return c
		}
		if c := cmp.Compare(a.start, b.start); c != 0 {
			return c
		}
		return cmp.Compare(a.end, b.end)
	})
	for i := 0; i < len(spans); {
		proto := spans[i].proto
		j := i
		for j < len(spans) && spans[j].proto == proto {
			j++
		}
		group := spans[i:j]
		i = j
		if group[0].start == 0 { // sorted: an every-port spec comes first
			out = append(out, policybpf.PortEntry{Protocol: proto})
			continue
		}
		cur := group[0]
		flush := func() {
			e := policybpf.PortEntry{Protocol: proto, StartPort: cur.start}
			if cur.end != cur.start {
				e.EndPort = cur.end
			}
			out = append(out, e)
		}
		for _, s := range group[1:] {
			if s.start <= cur.end+1 {
				cur.end = max(cur.end, s.end)
				continue
			}
			flush()
			cur = s
		}
		flush()
	}
	return out
}
