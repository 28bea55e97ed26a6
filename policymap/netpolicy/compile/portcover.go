package compile

import (
	"slices"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// portCover counts, per protocol and port, the live rules whose ports allow
// it, so that adding or removing a rule costs O(log n) per port spec and
// the merged union of the live ports is read in a few dozen steps, however
// many rules are live. Per protocol, the port space is cut at every spec's
// start and end+1 (coordinate compression): elementary interval i is ports
// coords[i] to coords[i+1]-1, adjacent intervals touch, so merging covered
// neighbours is mergePorts' merging of ranges that overlap or touch. A
// segment tree over the intervals holds, per node, how many specs cover it
// whole (cnt), and the number of maximal covered runs in it (runs) with
// whether its first and last interval are covered.
type portCover struct {
	protos    []protoCover // sorted by protocol number
	specs     []coverSpec
	ruleStart []int32 // rule r's specs are specs[ruleStart[r]:ruleStart[r+1]]
}

// coverSpec is a port spec in protocol and interval indexes; lo < 0 is
// every port.
type coverSpec struct {
	proto  int32
	lo, hi int32 // elementary intervals [lo, hi)
}

type protoCover struct {
	proto  uint32
	every  int32 // live specs allowing every port
	coords []uint32
	n      int32 // elementary intervals: len(coords)-1
	cnt    []int32
	runs   []int32
	lcov   []bool
	rcov   []bool
}

func newPortCover(rules []*endpoints.Rule) *portCover {
	c := &portCover{ruleStart: make([]int32, 0, len(rules)+1)}
	var protos []uint32
	for _, r := range rules {
		for _, p := range r.Ports {
			if !slices.Contains(protos, p.Protocol) {
				protos = append(protos, p.Protocol)
			}
		}
	}
	slices.Sort(protos)
	c.protos = make([]protoCover, len(protos))
	for i, p := range protos {
		c.protos[i].proto = p
	}
	for _, r := range rules {
		for _, p := range r.Ports {
			pc := &c.protos[slices.Index(protos, p.Protocol)]
			if p.Port != 0 {
				end := p.Port
				if p.EndPort != 0 {
					end = p.EndPort
				}
				pc.coords = append(pc.coords, uint32(p.Port), uint32(end)+1)
			}
		}
	}
	for i := range c.protos {
		pc := &c.protos[i]
		slices.Sort(pc.coords)
		pc.coords = slices.Compact(pc.coords)
		if len(pc.coords) > 1 {
			pc.n = int32(len(pc.coords) - 1)
			size := 4 * int(pc.n)
			pc.cnt, pc.runs = make([]int32, size), make([]int32, size)
			pc.lcov, pc.rcov = make([]bool, size), make([]bool, size)
		}
	}
	for _, r := range rules {
		c.ruleStart = append(c.ruleStart, int32(len(c.specs)))
		for _, p := range r.Ports {
			pi := slices.Index(protos, p.Protocol)
			s := coverSpec{proto: int32(pi), lo: -1}
			if p.Port != 0 {
				end := p.Port
				if p.EndPort != 0 {
					end = p.EndPort
				}
				coords := c.protos[pi].coords
				lo, _ := slices.BinarySearch(coords, uint32(p.Port))
				hi, _ := slices.BinarySearch(coords, uint32(end)+1)
				s.lo, s.hi = int32(lo), int32(hi)
			}
			c.specs = append(c.specs, s)
		}
	}
	c.ruleStart = append(c.ruleStart, int32(len(c.specs)))
	return c
}

// addRule adds (delta 1) or removes (delta -1) the ports of rule r.
func (c *portCover) addRule(r int, delta int32) {
	for _, s := range c.specs[c.ruleStart[r]:c.ruleStart[r+1]] {
		pc := &c.protos[s.proto]
		if s.lo < 0 {
			pc.every += delta
			continue
		}
		pc.update(1, 0, pc.n, s.lo, s.hi, delta)
	}
}

// update adds delta to the count of intervals [ql, qr) under node, which
// spans [l, r).
func (pc *protoCover) update(node, l, r, ql, qr, delta int32) {
	if qr <= l || r <= ql {
		return
	}
	if ql <= l && r <= qr {
		pc.cnt[node] += delta
		pc.pull(node, l, r)
		return
	}
	mid := (l + r) / 2
	pc.update(2*node, l, mid, ql, qr, delta)
	pc.update(2*node+1, mid, r, ql, qr, delta)
	pc.pull(node, l, r)
}

func (pc *protoCover) pull(node, l, r int32) {
	switch {
	case pc.cnt[node] > 0:
		pc.runs[node], pc.lcov[node], pc.rcov[node] = 1, true, true
	case r-l == 1:
		pc.runs[node], pc.lcov[node], pc.rcov[node] = 0, false, false
	default:
		a, b := 2*node, 2*node+1
		n := pc.runs[a] + pc.runs[b]
		if pc.rcov[a] && pc.lcov[b] {
			n--
		}
		pc.runs[node], pc.lcov[node], pc.rcov[node] = n, pc.lcov[a], pc.rcov[b]
	}
}

// count is the number of port entries of the union: per protocol, one if
// every port is allowed, else the number of maximal ranges.
func (c *portCover) count() int {
	n := 0
	for i := range c.protos {
		pc := &c.protos[i]
		switch {
		case pc.every > 0:
			n++
		case pc.n > 0:
			n += int(pc.runs[1])
		}
	}
	return n
}

// appendEntries appends the union as sorted, merged entries, as
// mergePorts does.
func (c *portCover) appendEntries(out []policybpf.PortEntry) []policybpf.PortEntry {
	for i := range c.protos {
		pc := &c.protos[i]
		switch {
		case pc.every > 0:
			out = append(out, policybpf.PortEntry{Protocol: pc.proto})
		case pc.n > 0 && pc.runs[1] > 0:
			first := len(out)
			out = pc.walk(out, 1, 0, pc.n)
			for j := first; j < len(out); j++ {
				if out[j].EndPort == out[j].StartPort {
					out[j].EndPort = 0
				}
			}
		}
	}
	return out
}

// walk appends the covered runs under node, merging touching ones; while
// walking, EndPort is the last port of a run even when equal to StartPort.
func (pc *protoCover) walk(out []policybpf.PortEntry, node, l, r int32) []policybpf.PortEntry {
	switch {
	case pc.cnt[node] > 0:
		start, end := pc.coords[l], pc.coords[r]-1
		if k := len(out) - 1; k >= 0 && out[k].Protocol == pc.proto && out[k].EndPort+1 == start {
			out[k].EndPort = end
			return out
		}
		return append(out, policybpf.PortEntry{Protocol: pc.proto, StartPort: start, EndPort: end})
	case pc.runs[node] == 0 || r-l == 1:
		return out
	}
	mid := (l + r) / 2
	out = pc.walk(out, 2*node, l, mid)
	return pc.walk(out, 2*node+1, mid, r)
}
