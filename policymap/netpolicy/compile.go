package netpolicy

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/enimasq/enimasq/bpf"
)

// portValue is a compiled map value: its kernel bytes, its text and, when
// the rules could not be encoded for a key, why it denies. Immutable and
// shared by every entry with the same value.
type portValue struct {
	bytes []byte
	text  string
	err   string
}

// The values every template uses.
var (
	denyPorts = newPortValue(bpf.PolicyValue{}, "")
	anyPorts  = newPortValue(bpf.PolicyValue{bpf.AnyPortEntry}, "")
)

func newPortValue(v bpf.PolicyValue, err string) *portValue {
	b, _ := v.MarshalBinary() // a fixed-size array: never fails
	return &portValue{bytes: b, text: v.String(), err: err}
}

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
//
// The entries of a pod are its selection's [policyTemplate]s stamped with
// its IP (compileSelection, stamp): pods with the same selecting objects and
// node IP share one compilation and its values.
func CompilePod(pod netip.Addr, pes []*PolicyEndpoint) []*PolicyMapEntry {
	sel, ok := selectionOf(pod, pes, func(pe *PolicyEndpoint) (PodEndpoint, bool) { return pe.podEntry(pod) })
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
		out = t.stamp(out, pod)
	}
	return out
}

// selection is what decides a pod IP's entries: its family, the objects
// that select it (sorted by key) and the node IPs they give for it. Pods
// with equal selections get equal entries but for the pod IP in the key.
type selection struct {
	family bpf.Family
	pes    []*PolicyEndpoint
	hosts  []netip.Addr // sorted, of the family
}

// selectionOf returns the selection of a pod IP among pes, with entry
// finding the pod's entry in an object; false if no object selects it.
func selectionOf(pod netip.Addr, pes []*PolicyEndpoint, entry func(*PolicyEndpoint) (PodEndpoint, bool)) (selection, bool) {
	sel := selection{family: bpf.FamilyOf(pod)}
	for _, pe := range pes {
		e, ok := entry(pe)
		if !ok {
			continue
		}
		sel.pes = append(sel.pes, pe)
		if h := e.HostIP; h.IsValid() && bpf.FamilyOf(h) == sel.family && !slices.Contains(sel.hosts, h) {
			sel.hosts = append(sel.hosts, h)
		}
	}
	if len(sel.pes) == 0 {
		return sel, false
	}
	slices.SortFunc(sel.pes, func(a, b *PolicyEndpoint) int { return cmp.Compare(a.Key(), b.Key()) })
	slices.SortFunc(sel.hosts, netip.Addr.Compare)
	return sel, true
}

// key identifies the selection while its objects are alive: the objects
// are immutable, so their addresses stand for their contents.
func (s selection) key() string {
	b := make([]byte, 0, 1+8*len(s.pes)+17*len(s.hosts))
	b = append(b, byte(s.family))
	for _, pe := range s.pes {
		b = fmt.Appendf(b, "%p", pe)
	}
	for _, h := range s.hosts {
		b = append(b, '/')
		b = append(b, h.AsSlice()...)
	}
	return string(b)
}

// weight is the size of the selection's compile work: its rules and
// excepts in the directions its objects isolate.
func (s selection) weight() int {
	n := 0
	for _, pe := range s.pes {
		for _, d := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
			if !pe.Isolates(d) {
				continue
			}
			for _, r := range pe.Rules(d) {
				n += 1 + len(r.Except)
			}
		}
	}
	return n
}

// policyTemplate is the compiled entries of one map for every pod IP of
// one selection: peers and values, without the pod IP. Immutable; the rows
// stamped from it point at its entries.
type policyTemplate struct {
	mapName string
	// blocks hold the entries, in order, templateBlock to a block.
	blocks [][]templateEntry
	n      int
}

type templateEntry struct {
	mapName string
	peer    netip.Prefix
	value   *portValue
}

// templateBlock is how many template entries are allocated together. A
// row keeps the block of its entry alive, not the template: after an edit
// of a large PolicyEndpoint, the rows that did not change still point at
// the old template, and a template of 50,000 rules is 4 MB.
const templateBlock = 256

// reserve allocates the blocks for up to n entries before they are
// compiled: allocated while the sweep ran, they made a 50k-rule compile
// that meets the collector two to three times slower here. done drops the
// blocks left empty.
func (t *policyTemplate) reserve(n int) {
	for ; n > 0; n -= templateBlock {
		t.blocks = append(t.blocks, make([]templateEntry, 0, min(n, templateBlock)))
	}
}

func (t *policyTemplate) done() {
	t.blocks = t.blocks[:(t.n+templateBlock-1)/templateBlock]
}

// add appends an entry to the template: block i holds entries
// i*templateBlock to (i+1)*templateBlock-1.
func (t *policyTemplate) add(e templateEntry) {
	i := t.n / templateBlock
	if i == len(t.blocks) {
		t.blocks = append(t.blocks, nil)
	}
	e.mapName = t.mapName
	t.blocks[i] = append(t.blocks[i], e)
	t.n++
}

// compileSelection returns the templates of the selection, egress first.
func compileSelection(sel selection) []*policyTemplate {
	out := make([]*policyTemplate, 0, 2)
	for _, d := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		out = append(out, compileDirection(sel, d))
	}
	return out
}

func rootPrefix(fam bpf.Family) netip.Prefix {
	if fam == bpf.IPv6 {
		return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
}

// event kinds at a boundary prefix, in the order they are sorted.
const (
	evBoundary = iota // a key only: the root, an except of no effect
	evHost            // the node IP: allow-all
	evCIDR            // the rule's cidr starts
	evExcept          // the rule's except starts
)

// sweepItem is a boundary prefix and what starts there, in 24 bytes: the
// address left-aligned in 128 bits (an IPv4 address in the top 32), so
// that sorting by (hi, lo, bits) is the prefix tree in preorder.
type sweepItem struct {
	hi, lo uint64
	rule   int32
	bits   uint8
	kind   uint8
}

func newSweepItem(p netip.Prefix, kind uint8, rule int) sweepItem {
	it := sweepItem{bits: uint8(p.Bits()), kind: kind, rule: int32(rule)}
	if p.Addr().Is4() {
		a := p.Addr().As4()
		it.hi = uint64(binary.BigEndian.Uint32(a[:])) << 32
		return it
	}
	a := p.Addr().As16()
	it.hi, it.lo = binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:])
	return it
}

// prefix is the item's prefix, of family fam.
func (it *sweepItem) prefix(fam bpf.Family) netip.Prefix {
	if fam == bpf.IPv4 {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], uint32(it.hi>>32))
		return netip.PrefixFrom(netip.AddrFrom4(a), int(it.bits))
	}
	var a [16]byte
	binary.BigEndian.PutUint64(a[:8], it.hi)
	binary.BigEndian.PutUint64(a[8:], it.lo)
	return netip.PrefixFrom(netip.AddrFrom16(a), int(it.bits))
}

func (a *sweepItem) samePrefix(b *sweepItem) bool {
	return a.hi == b.hi && a.lo == b.lo && a.bits == b.bits
}

// contains reports whether a's prefix contains b's.
func (a *sweepItem) contains(b *sweepItem) bool {
	if a.bits > b.bits {
		return false
	}
	hi, lo := b.hi, b.lo
	switch {
	case a.bits == 0:
		hi, lo = 0, 0
	case a.bits <= 64:
		hi &= ^uint64(0) << (64 - a.bits)
		lo = 0
	case a.bits < 128:
		lo &= ^uint64(0) << (128 - a.bits)
	}
	return hi == a.hi && lo == a.lo
}

// compileDirection compiles one direction of a selection in one sweep:
// the boundaries, sorted by address then length, are the prefix tree in
// preorder; a stack holds the boundaries that contain the current one. A
// rule is live below its cidr and blocked below any of its excepts;
// entering a boundary adds or removes the ports of the rules that start or
// are excepted there, leaving it undoes that. The live ports are counted
// per port (portCover), so the value at a boundary costs at most a few
// dozen steps whatever the number of rules. Time: O(n log n) in the
// number of cidrs, excepts and port specs.
func compileDirection(sel selection, d bpf.Direction) *policyTemplate {
	fam := sel.family
	root := rootPrefix(fam)
	t := &policyTemplate{mapName: bpf.PolicyMapName(d, fam)}

	isolated, n := false, 0
	for _, pe := range sel.pes {
		if pe.Isolates(d) {
			isolated, n = true, n+len(pe.Rules(d))
		}
	}
	rules := make([]*Rule, 0, n)
	for _, pe := range sel.pes {
		if !pe.Isolates(d) {
			continue
		}
		rs := pe.Rules(d)
		for i := range rs {
			if rs[i].CIDR.IsValid() && bpf.FamilyOf(rs[i].CIDR.Addr()) == fam {
				rules = append(rules, &rs[i])
			}
		}
	}
	if !isolated {
		t.add(templateEntry{peer: root, value: anyPorts})
		return t
	}

	n = 1 + len(sel.hosts) + len(rules)
	for _, r := range rules {
		n += len(r.Except)
	}
	items := make([]sweepItem, 0, n)
	items = append(items, newSweepItem(root, evBoundary, -1))
	for _, h := range sel.hosts {
		items = append(items, newSweepItem(netip.PrefixFrom(h, h.BitLen()), evHost, -1))
	}
	dead := make([]bool, len(rules)) // an except covers the whole cidr
	for i, r := range rules {
		items = append(items, newSweepItem(r.CIDR, evCIDR, i))
		for _, e := range r.Except {
			switch {
			case !e.IsValid() || bpf.FamilyOf(e.Addr()) != fam:
				continue // dropped by the parser; never a key of the wrong family
			case prefixContains(e, r.CIDR):
				dead[i] = true
				items = append(items, newSweepItem(e, evBoundary, -1))
			case prefixContains(r.CIDR, e):
				items = append(items, newSweepItem(e, evExcept, i))
			default: // disjoint: excludes nothing, still a key
				items = append(items, newSweepItem(e, evBoundary, -1))
			}
		}
	}
	slices.SortFunc(items, func(a, b sweepItem) int {
		if c := cmp.Compare(a.hi, b.hi); c != 0 {
			return c
		}
		if c := cmp.Compare(a.lo, b.lo); c != 0 {
			return c
		}
		if c := cmp.Compare(a.bits, b.bits); c != 0 {
			return c
		}
		return cmp.Compare(a.kind, b.kind)
	})

	t.reserve(len(items)) // one entry a distinct prefix: at most one an item
	cover := newPortCover(rules)
	live := make([]bool, len(rules))
	blocked := make([]int32, len(rules))
	allowAll := 0 // live, unblocked rules without ports
	add := func(r int32, delta int) {
		if len(rules[r].Ports) == 0 {
			allowAll += delta
			return
		}
		cover.addRule(int(r), int32(delta))
	}
	apply := func(group []sweepItem) {
		for _, it := range group {
			switch r := it.rule; {
			case it.kind == evCIDR && !dead[r]:
				live[r] = true
				if blocked[r] == 0 {
					add(r, 1)
				}
			case it.kind == evExcept && !dead[r]:
				if blocked[r]++; blocked[r] == 1 && live[r] {
					add(r, -1)
				}
			}
		}
	}
	undo := func(group []sweepItem) {
		for i := len(group) - 1; i >= 0; i-- {
			it := &group[i]
			switch r := it.rule; {
			case it.kind == evCIDR && !dead[r]:
				live[r] = false
				if blocked[r] == 0 {
					add(r, -1)
				}
			case it.kind == evExcept && !dead[r]:
				if blocked[r]--; blocked[r] == 0 && live[r] {
					add(r, 1)
				}
			}
		}
	}

	values := newValueInterner()
	var stack [][]sweepItem
	for i := 0; i < len(items); {
		j := i + 1
		for j < len(items) && items[j].samePrefix(&items[i]) {
			j++
		}
		group := items[i:j]
		i = j
		for len(stack) > 0 && !stack[len(stack)-1][0].contains(&group[0]) {
			undo(stack[len(stack)-1])
			stack = stack[:len(stack)-1]
		}
		apply(group)
		stack = append(stack, group)

		peer := group[0].prefix(fam)
		switch {
		case slices.ContainsFunc(group, func(it sweepItem) bool { return it.kind == evHost }):
			t.add(templateEntry{peer: peer, value: anyPorts})
		case allowAll > 0:
			t.add(templateEntry{peer: peer, value: anyPorts})
		default:
			t.add(templateEntry{peer: peer, value: values.value(cover)})
		}
	}
	t.done()
	return t
}

// valueInterner shares the values of a template: a value seen before
// costs no allocation.
type valueInterner struct {
	scratch []bpf.PortEntry
	key     []byte
	seen    map[string]*portValue
}

func newValueInterner() *valueInterner {
	return &valueInterner{seen: map[string]*portValue{}}
}

// value returns the value of the live ports.
func (v *valueInterner) value(cover *portCover) *portValue {
	n := cover.count()
	switch {
	case n == 0:
		return denyPorts
	case n > bpf.PolicyMaxPortEntries:
		return v.tooMany(n)
	}
	v.scratch = cover.appendEntries(v.scratch[:0])
	v.key = v.key[:0]
	for _, e := range v.scratch {
		v.key = binary.LittleEndian.AppendUint32(v.key, e.Protocol)
		v.key = binary.LittleEndian.AppendUint32(v.key, e.StartPort)
		v.key = binary.LittleEndian.AppendUint32(v.key, e.EndPort)
	}
	if pv, ok := v.seen[string(v.key)]; ok {
		return pv
	}
	b, text, err := bpf.EncodePortEntries(v.scratch)
	if err != nil { // the count was checked; protocols are never 0
		return &portValue{bytes: denyPorts.bytes, text: denyPorts.text, err: err.Error()}
	}
	pv := &portValue{bytes: b, text: text}
	v.seen[string(v.key)] = pv
	return pv
}

// tooMany is the value of a key whose union has n > 24 entries: it denies
// and says why. One per n.
func (v *valueInterner) tooMany(n int) *portValue {
	key := fmt.Sprintf("too many: %d", n)
	if pv, ok := v.seen[key]; ok {
		return pv
	}
	msg := fmt.Sprintf("%d distinct port entries, a key holds at most %d: the key denies (fails closed)", n, bpf.PolicyMaxPortEntries)
	pv := &portValue{bytes: denyPorts.bytes, text: denyPorts.text, err: msg}
	v.seen[key] = pv
	return pv
}

// stamp appends the template's entries for a pod IP to out, from one
// block: each row points at its template entry.
func (t *policyTemplate) stamp(out []*PolicyMapEntry, pod netip.Addr) []*PolicyMapEntry {
	rows := make([]PolicyMapEntry, 0, t.n)
	for _, b := range t.blocks {
		for i := range b {
			rows = append(rows, PolicyMapEntry{Pod: pod, t: &b[i]})
			out = append(out, &rows[len(rows)-1])
		}
	}
	return out
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

// prefixContains reports whether outer contains all of inner.
func prefixContains(outer, inner netip.Prefix) bool {
	return outer.Bits() <= inner.Bits() && outer.Contains(inner.Addr())
}

// mergePorts is the union of port specs as sorted, merged entries: per
// protocol (in protocol number order), every port if any spec says so,
// otherwise the ranges merged where they overlap or touch. It is the
// reference for portCover.
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
