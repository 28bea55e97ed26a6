package netpolicy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/enimasq/enimasq/bpf"
)

// Shared value bytes: entries are immutable, so one copy serves all.
var (
	denyValue    bpf.PolicyValue
	denyBytes, _ = denyValue.MarshalBinary()
	anyValue     = bpf.PolicyValue{bpf.AnyPortEntry}
	anyBytes, _  = anyValue.MarshalBinary()
)

// CompilePod returns the map entries of a pod IP for every direction, from
// the PolicyEndpoints that select it (objects in pes that do not list the
// pod IP are ignored), in the maps of the pod IP's family. It is pure and
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
// covers the peer iff it covers B. A union of more than
// bpf.PolicyMaxPortEntries entries is an error on the entry, whose value
// then denies (fails closed).
func CompilePod(pod netip.Addr, pes []*PolicyEndpoint) []*PolicyMapEntry {
	var out []*PolicyMapEntry
	for _, d := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		out = compileDirection(out, pod, d, pes)
	}
	return out
}

// boundary is a prefix that gets a key, and whether it is the node's IP.
type boundary struct {
	prefix netip.Prefix
	host   bool
}

func compileDirection(out []*PolicyMapEntry, pod netip.Addr, d bpf.Direction, pes []*PolicyEndpoint) []*PolicyMapEntry {
	fam := bpf.FamilyOf(pod)
	root := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	if fam == bpf.IPv6 {
		root = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}

	isolated, selected := false, false
	var rules []*Rule
	var hosts []netip.Addr
	for _, pe := range pes {
		podEntry, ok := pe.podEntry(pod)
		if !ok {
			continue
		}
		selected = true
		if podEntry.HostIP.IsValid() && !slices.Contains(hosts, podEntry.HostIP) {
			hosts = append(hosts, podEntry.HostIP)
		}
		if !pe.Isolates(d) {
			continue
		}
		isolated = true
		rs := pe.Rules(d)
		for i := range rs {
			if bpf.FamilyOf(rs[i].CIDR.Addr()) == fam {
				rules = append(rules, &rs[i])
			}
		}
	}
	if !selected {
		return out
	}
	if !isolated {
		w := newEntryWriter(bpf.PolicyMapName(d, fam), pod, 1)
		return append(out, w.entry(root, anyBytes, anyText, ""))
	}

	bounds := []boundary{{prefix: root}}
	for _, r := range rules {
		bounds = append(bounds, boundary{prefix: r.CIDR})
		for _, e := range r.Except {
			bounds = append(bounds, boundary{prefix: e})
		}
	}
	for _, h := range hosts {
		bounds = append(bounds, boundary{prefix: netip.PrefixFrom(h, h.BitLen()), host: true})
	}
	// Sorted by prefix, host first among equals, then deduplicated: a host
	// that is also a rule's /32 is still always allowed.
	slices.SortFunc(bounds, func(a, b boundary) int {
		if c := comparePrefixes(a.prefix, b.prefix); c != 0 {
			return c
		}
		switch {
		case a.host && !b.host:
			return -1
		case b.host && !a.host:
			return 1
		}
		return 0
	})
	bounds = slices.CompactFunc(bounds, func(a, b boundary) bool { return a.prefix == b.prefix })

	w := newEntryWriter(bpf.PolicyMapName(d, fam), pod, len(bounds))
	var ports []Port
	var scratch []bpf.PortEntry
	for _, b := range bounds {
		if b.host {
			out = append(out, w.entry(b.prefix, anyBytes, anyText, ""))
			continue
		}
		ports = ports[:0]
		allowAll := false
		for _, r := range rules {
			if !r.applies(b.prefix) {
				continue
			}
			if len(r.Ports) == 0 {
				allowAll = true
				break
			}
			ports = append(ports, r.Ports...)
		}
		if allowAll {
			out = append(out, w.entry(b.prefix, anyBytes, anyText, ""))
			continue
		}
		scratch = mergePorts(scratch[:0], ports)
		switch {
		case len(scratch) == 0:
			out = append(out, w.entry(b.prefix, denyBytes, denyText, ""))
		case len(scratch) > bpf.PolicyMaxPortEntries:
			msg := fmt.Sprintf("%d distinct port entries, a key holds at most %d: the key denies (fails closed)", len(scratch), bpf.PolicyMaxPortEntries)
			out = append(out, w.entry(b.prefix, denyBytes, denyText, msg))
		default:
			out = append(out, w.valueEntry(b.prefix, scratch))
		}
	}
	return out
}

// Texts of the shared values.
var (
	denyText = denyValue.String()
	anyText  = anyValue.String()
)

// entryWriter makes the entries of one pod IP and direction with few
// allocations: the entries and their keys each come from one block; the
// deny and allow-all values are shared by all entries.
type entryWriter struct {
	mapName string
	pod     netip.Addr
	entries []PolicyMapEntry
	keys    []byte
}

func newEntryWriter(mapName string, pod netip.Addr, n int) *entryWriter {
	return &entryWriter{
		mapName: mapName,
		pod:     pod,
		entries: make([]PolicyMapEntry, 0, n),
		keys:    make([]byte, 0, n*(4+2*pod.BitLen()/8)),
	}
}

// entry adds the entry of peer with the given value.
func (w *entryWriter) entry(peer netip.Prefix, value []byte, text, compileErr string) *PolicyMapEntry {
	w.entries = append(w.entries, PolicyMapEntry{
		Map:   w.mapName,
		Pod:   w.pod,
		Peer:  peer,
		Ports: text,
		Error: compileErr,
		value: value,
	})
	e := &w.entries[len(w.entries)-1]
	start := len(w.keys)
	keys, err := bpf.AppendPolicyKey(w.keys, w.pod, peer)
	if err != nil {
		// Pod and peer are of one family by construction; never encode
		// something else.
		e.Map, e.Error = "", fmt.Sprintf("cannot encode: %s", err)
		return e
	}
	w.keys = keys
	e.key = w.keys[start:len(w.keys):len(w.keys)]
	return e
}

// valueEntry adds the entry of peer with a value of at most
// bpf.PolicyMaxPortEntries port entries.
func (w *entryWriter) valueEntry(peer netip.Prefix, ports []bpf.PortEntry) *PolicyMapEntry {
	vb, text, err := bpf.EncodePortEntries(ports)
	if err != nil { // the caller checked the count; protocols are never 0
		return w.entry(peer, denyBytes, denyText, err.Error())
	}
	return w.entry(peer, vb, text, "")
}

// podEntry returns the object's entry for a pod IP.
func (pe *PolicyEndpoint) podEntry(pod netip.Addr) (PodEndpoint, bool) {
	for _, p := range pe.Pods {
		if p.PodIP == pod {
			return p, true
		}
	}
	return PodEndpoint{}, false
}

// applies reports whether the rule covers all of prefix b: its cidr
// contains b and none of its excepts does.
func (r *Rule) applies(b netip.Prefix) bool {
	if !prefixContains(r.CIDR, b) {
		return false
	}
	for _, e := range r.Except {
		if prefixContains(e, b) {
			return false
		}
	}
	return true
}

// prefixContains reports whether outer contains all of inner.
func prefixContains(outer, inner netip.Prefix) bool {
	return outer.Bits() <= inner.Bits() && outer.Contains(inner.Addr())
}

func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

// mergePorts is the union of port specs as sorted, merged entries: per
// protocol (in protocol number order), every port if any spec says so,
// otherwise the ranges merged where they overlap or touch.
func mergePorts(out []bpf.PortEntry, ports []Port) []bpf.PortEntry {
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
			out = append(out, bpf.PortEntry{Protocol: proto})
			continue
		}
		cur := group[0]
		flush := func() {
			e := bpf.PortEntry{Protocol: proto, StartPort: cur.start}
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
