package compile

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// The sweep of one direction: from a selection's rules, the boundary prefixes and the port cover of each, in one pass over the prefixes sorted (compileDirection).

func rootPrefix(fam bpf.Family) netip.Prefix {
	if fam == bpf.IPv6 {
		return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
}

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
func compileDirection(sel selection[*endpoints.PolicyEndpoint], d policybpf.Direction) *policyTemplate {
	fam := sel.family
	root := rootPrefix(fam)
	t := &policyTemplate{mapName: policybpf.PolicyMapName(d, fam)}

	isolated, n := false, 0
	for _, pe := range sel.objs {
		if pe.Isolates(d) {
			isolated, n = true, n+len(pe.Rules(d))
		}
	}
	rules := make([]*endpoints.Rule, 0, n)
	for _, pe := range sel.objs {
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
		t.add(templateEntry{peer: root, value: notIsolated})
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

// event kinds at a boundary prefix, in the order they are sorted.
const (
	evBoundary = iota // a key only: the root, an except of no effect
	evHost            // the node IP: allow-all
	evCIDR            // the rule's cidr starts
	evExcept          // the rule's except starts
)

// prefixContains reports whether outer contains all of inner.
func prefixContains(outer, inner netip.Prefix) bool {
	return outer.Bits() <= inner.Bits() && outer.Contains(inner.Addr())
}
