package policybpf

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/enimasq/enimasq/bpf"
	"slices"
	"strconv"
	"strings"
)

// A policy map value (c/policy.c, struct policy_value) is a list of
// disjoint intervals of the port space, sorted, each with what it decides.
// The port space is one line: point protocol<<16 | destination port, so an
// interval is a range of ports of one protocol, every port of a protocol
// (tcp/*), or several whole protocols (every protocol: "any"). A packet
// without ports (ICMP, other protocols) is at its protocol's port 0, so
// only intervals that hold every port of its protocol hold it.
//
// The first PolicyInlineIntervals intervals are in the value; the others in
// chunks of PolicyChunkIntervals in the map's chunk map, under the value's
// list id: the SHA-256 of those intervals, cut to 16 bytes. Chunks are
// content-addressed: values with the same intervals share them, and a chunk
// never changes once written. The program looks up a value's chunks by a
// binary search and denies a packet whose chunk is missing.

const (
	// PolicyInlineIntervals is how many intervals a map value holds; a
	// longer list continues in chunks.
	PolicyInlineIntervals = 32
	// PolicyChunkIntervals is how many intervals a chunk holds.
	PolicyChunkIntervals = 64

	intervalSize = 16
	listIDSize   = 16
	// PolicyValueSize is {u32 flags; u32 count; u8 list[16]; 32 x interval}.
	PolicyValueSize = 4 + 4 + listIDSize + PolicyInlineIntervals*intervalSize
	// PolicyChunkKeySize is {u8 list[16]; u32 index}.
	PolicyChunkKeySize = listIDSize + 4
	// PolicyChunkValueSize is 64 intervals.
	PolicyChunkValueSize = PolicyChunkIntervals * intervalSize

	// PolicyChunksMapName holds the chunks of the NetworkPolicy maps,
	// ClusterChunksMapName those of the cluster maps.
	PolicyChunksMapName  = "enimasq_policy_chunks"
	ClusterChunksMapName = "enimasq_cluster_chunks"
	// PolicyChunksDefaultMaxEntries is the default size of a chunk map.
	PolicyChunksDefaultMaxEntries = 65536

	// valueNotIsolated is struct policy_value's VALUE_NOT_ISOLATED.
	valueNotIsolated = 1

	// PortSpaceEnd is the last point of the port space.
	PortSpaceEnd = 0xff<<16 | 0xffff
)

// Action is what an interval's outcome does (the top two bits of an
// outcome word).
type Action uint8

const (
	// ActionNone decides nothing: the next step does (a Pass, or no rule).
	ActionNone Action = iota
	ActionAccept
	ActionDeny
)

func (a Action) String() string {
	switch a {
	case ActionNone:
		return "none"
	case ActionAccept:
		return "accept"
	case ActionDeny:
		return "deny"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Outcome is an interval's decision for one step: an action and the id of
// the deciding object (ObjectID; 0 when the agent names it).
type Outcome uint32

// NewOutcome packs an action and an object id (its low 30 bits).
func NewOutcome(a Action, object uint32) Outcome {
	return Outcome(uint32(a)<<30 | object&objectMask)
}

const objectMask = 1<<30 - 1

func (o Outcome) Action() Action { return Action(o >> 30) }
func (o Outcome) Object() uint32 { return uint32(o) & objectMask }
func (o Outcome) String() string { return fmt.Sprintf("%s#%d", o.Action(), o.Object()) }

// ObjectID is the id of a policy object in outcomes, events and verdicts:
// FNV-1a of "kind/key", cut to 30 bits, never 0. The agent maps it back to
// the name from its tables (an id names an object, it decides nothing: two
// names with one id only make a listing ambiguous).
func ObjectID(kind, key string) uint32 {
	h := uint32(2166136261)
	for _, s := range []string{kind, "/", key} {
		for i := 0; i < len(s); i++ {
			h ^= uint32(s[i])
			h *= 16777619
		}
	}
	if h &= objectMask; h == 0 {
		h = 1
	}
	return h
}

// Interval is one interval of a value: points Lo to Hi, both included.
// NetworkPolicy values use First (ActionAccept: allowed); cluster values
// First for the Admin tier and Second for the Baseline tier.
type Interval struct {
	Lo, Hi        uint32
	First, Second Outcome
}

// PortPoint is the point of a packet in the port space.
func PortPoint(proto uint32, port uint16, portKnown bool) uint32 {
	if !portKnown {
		port = 0
	}
	return proto<<16 | uint32(port)
}

// IntervalOf is the interval of a port entry.
func IntervalOf(e PortEntry) Interval {
	switch {
	case e.Protocol == ProtocolAny && e.StartPort == 0:
		return Interval{Lo: 0, Hi: PortSpaceEnd}
	case e.StartPort == 0:
		return Interval{Lo: e.Protocol << 16, Hi: e.Protocol<<16 | 0xffff}
	case e.EndPort == 0:
		return Interval{Lo: e.Protocol<<16 | e.StartPort, Hi: e.Protocol<<16 | e.StartPort}
	default:
		return Interval{Lo: e.Protocol<<16 | e.StartPort, Hi: e.Protocol<<16 | e.EndPort}
	}
}

// AllowIntervals returns the intervals that allow what the entries allow
// (sorted and merged where they overlap or touch), each with outcome
// allow. ProtocolAny with a port is every protocol with ports (TCP, UDP,
// SCTP) on that port.
func AllowIntervals(entries []PortEntry, allow Outcome) []Interval {
	ivs := make([]Interval, 0, len(entries))
	for _, e := range entries {
		if e.Protocol == ProtocolAny && e.StartPort != 0 {
			for _, p := range []uint32{ProtocolTCP, ProtocolUDP, ProtocolSCTP} {
				x := e
				x.Protocol = p
				ivs = append(ivs, IntervalOf(x))
			}
			continue
		}
		ivs = append(ivs, IntervalOf(e))
	}
	slices.SortFunc(ivs, func(a, b Interval) int { return cmp.Or(cmp.Compare(a.Lo, b.Lo), cmp.Compare(a.Hi, b.Hi)) })
	out := ivs[:0]
	for _, iv := range ivs {
		iv.First = allow
		if n := len(out); n > 0 && iv.Lo <= out[n-1].Hi+1 {
			out[n-1].Hi = max(out[n-1].Hi, iv.Hi)
			continue
		}
		out = append(out, iv)
	}
	return out
}

// PolicyValue is the value of a policy-map entry.
type PolicyValue struct {
	// NotIsolated: a NetworkPolicy selects the pod without isolating it
	// in the direction (the Baseline tier and the default decide).
	NotIsolated bool
	// Intervals are sorted and disjoint.
	Intervals []Interval
}

// Check reports whether the intervals are sorted and disjoint.
func (v *PolicyValue) Check() error {
	for i, iv := range v.Intervals {
		if iv.Lo > iv.Hi || iv.Hi > PortSpaceEnd {
			return fmt.Errorf("interval %d: %#x-%#x is not an interval of the port space", i, iv.Lo, iv.Hi)
		}
		if i > 0 && iv.Lo <= v.Intervals[i-1].Hi {
			return fmt.Errorf("interval %d: %#x-%#x is not after interval %d", i, iv.Lo, iv.Hi, i-1)
		}
	}
	return nil
}

// Search returns the index of the interval that holds point k, or -1: the
// program's search, in Go.
func (v *PolicyValue) Search(k uint32) int {
	i, _ := slices.BinarySearchFunc(v.Intervals, k, func(iv Interval, k uint32) int {
		if iv.Hi < k {
			return -1
		}
		if iv.Lo > k {
			return 1
		}
		return 0
	})
	if i < len(v.Intervals) && v.Intervals[i].Lo <= k && k <= v.Intervals[i].Hi {
		return i
	}
	return -1
}

// Encode returns the kernel bytes of the value and its chunks (none when
// the intervals fit the value).
func (v *PolicyValue) Encode() ([]byte, []bpf.SpillEntry, error) {
	if err := v.Check(); err != nil {
		return nil, nil, err
	}
	b := make([]byte, PolicyValueSize)
	if v.NotIsolated {
		binary.NativeEndian.PutUint32(b[0:], valueNotIsolated)
	}
	n := len(v.Intervals)
	if uint64(n) > 1<<32-1 {
		return nil, nil, fmt.Errorf("%d intervals", n)
	}
	binary.NativeEndian.PutUint32(b[4:], uint32(n))
	for i, iv := range v.Intervals[:min(n, PolicyInlineIntervals)] {
		putInterval(b[24+i*intervalSize:], iv)
	}
	if n <= PolicyInlineIntervals {
		return b, nil, nil
	}
	rest := v.Intervals[PolicyInlineIntervals:]
	raw := make([]byte, len(rest)*intervalSize)
	for i, iv := range rest {
		putInterval(raw[i*intervalSize:], iv)
	}
	sum := sha256.Sum256(raw)
	copy(b[8:8+listIDSize], sum[:listIDSize])
	chunks := make([]bpf.SpillEntry, 0, (len(rest)+PolicyChunkIntervals-1)/PolicyChunkIntervals)
	for c := 0; c*PolicyChunkIntervals < len(rest); c++ {
		key := make([]byte, PolicyChunkKeySize)
		copy(key, sum[:listIDSize])
		binary.NativeEndian.PutUint32(key[listIDSize:], uint32(c))
		val := make([]byte, PolicyChunkValueSize)
		copy(val, raw[c*PolicyChunkValueSize:min(len(raw), (c+1)*PolicyChunkValueSize)])
		chunks = append(chunks, bpf.SpillEntry{Key: key, Value: val})
	}
	return b, chunks, nil
}

func putInterval(b []byte, iv Interval) {
	binary.NativeEndian.PutUint32(b[0:], iv.Lo)
	binary.NativeEndian.PutUint32(b[4:], iv.Hi)
	binary.NativeEndian.PutUint32(b[8:], uint32(iv.First))
	binary.NativeEndian.PutUint32(b[12:], uint32(iv.Second))
}

func getInterval(b []byte) Interval {
	return Interval{
		Lo: binary.NativeEndian.Uint32(b[0:]), Hi: binary.NativeEndian.Uint32(b[4:]),
		First: Outcome(binary.NativeEndian.Uint32(b[8:])), Second: Outcome(binary.NativeEndian.Uint32(b[12:])),
	}
}

// ErrChunkMissing is returned by UnmarshalPolicyValue for a value whose
// chunk is not in the chunk map (the program denies such a value's
// packets).
var ErrChunkMissing = errors.New("chunk missing")

// UnmarshalPolicyValue decodes the kernel bytes of a policy value, reading
// its chunks with lookup (a chunk-map lookup; nil for a value that fits).
func UnmarshalPolicyValue(b []byte, lookup func(key []byte) ([]byte, error)) (PolicyValue, error) {
	var v PolicyValue
	if len(b) != PolicyValueSize {
		return v, fmt.Errorf("policy value: %d bytes, want %d", len(b), PolicyValueSize)
	}
	v.NotIsolated = binary.NativeEndian.Uint32(b[0:])&valueNotIsolated != 0
	n := int(binary.NativeEndian.Uint32(b[4:]))
	v.Intervals = make([]Interval, 0, min(n, 1<<16))
	for i := range min(n, PolicyInlineIntervals) {
		v.Intervals = append(v.Intervals, getInterval(b[24+i*intervalSize:]))
	}
	for c := 0; PolicyInlineIntervals+c*PolicyChunkIntervals < n; c++ {
		if lookup == nil {
			return v, fmt.Errorf("policy value of %d intervals: chunk %d: %w", n, c, ErrChunkMissing)
		}
		key := make([]byte, PolicyChunkKeySize)
		copy(key, b[8:8+listIDSize])
		binary.NativeEndian.PutUint32(key[listIDSize:], uint32(c))
		chunk, err := lookup(key)
		if err != nil {
			return v, fmt.Errorf("policy value of %d intervals: chunk %d: %w", n, c, err)
		}
		if len(chunk) != PolicyChunkValueSize {
			return v, fmt.Errorf("policy value chunk %d: %d bytes, want %d", c, len(chunk), PolicyChunkValueSize)
		}
		for i := range min(PolicyChunkIntervals, n-PolicyInlineIntervals-c*PolicyChunkIntervals) {
			v.Intervals = append(v.Intervals, getInterval(chunk[i*intervalSize:]))
		}
	}
	return v, nil
}

// IntervalText is an interval as ports: "tcp/80", "udp/53-55", "sctp/*",
// "any", or per protocol for an interval over several, whole protocols
// in between as a range of numbers ("tcp/1000-65535,7-16/*,udp/*").
func IntervalText(iv Interval) string {
	if iv.Lo == 0 && iv.Hi == PortSpaceEnd {
		return "any"
	}
	var parts []string
	whole := func(from, to uint32) {
		switch {
		case from > to:
		case from == to:
			parts = append(parts, ProtocolName(from)+"/*")
		default:
			parts = append(parts, fmt.Sprintf("%d-%d/*", from, to))
		}
	}
	lo, hi := iv.Lo>>16, iv.Hi>>16
	first, last := lo, hi // the whole protocols are first..last
	if iv.Lo&0xffff != 0 || (lo == hi && iv.Hi&0xffff != 0xffff) {
		end := uint32(0xffff)
		if lo == hi {
			end = iv.Hi & 0xffff
		}
		parts = append(parts, portRangeText(lo, iv.Lo&0xffff, end))
		first = lo + 1
	}
	if lo == hi {
		if len(parts) == 0 {
			whole(lo, lo)
		}
		return strings.Join(parts, ",")
	}
	partialLast := iv.Hi&0xffff != 0xffff
	if partialLast {
		last = hi - 1
	}
	whole(first, last)
	if partialLast {
		parts = append(parts, portRangeText(hi, 0, iv.Hi&0xffff))
	}
	return strings.Join(parts, ",")
}

func portRangeText(proto, lo, hi uint32) string {
	name := ProtocolName(proto)
	switch {
	case lo == 0 && hi == 0xffff:
		return name + "/*"
	case lo == hi:
		return name + "/" + strconv.Itoa(int(lo))
	default:
		return fmt.Sprintf("%s/%d-%d", name, lo, hi)
	}
}

// AllowValue is the NetworkPolicy value of an isolated pod that allows
// what the entries allow (no entry: nothing).
func AllowValue(entries ...PortEntry) *PolicyValue {
	return &PolicyValue{Intervals: AllowIntervals(entries, NewOutcome(ActionAccept, 0))}
}

// shownIntervals is how many intervals String names before "and N more".
const shownIntervals = 16

// String is the value as its intervals' ports ("deny" for none; "not
// isolated"), outcomes aside.
func (v *PolicyValue) String() string {
	if v.NotIsolated {
		return "not isolated"
	}
	if len(v.Intervals) == 0 {
		return "deny"
	}
	parts := make([]string, 0, min(len(v.Intervals), shownIntervals))
	for _, iv := range v.Intervals[:min(len(v.Intervals), shownIntervals)] {
		parts = append(parts, IntervalText(iv))
	}
	text := strings.Join(parts, ",")
	if n := len(v.Intervals) - shownIntervals; n > 0 {
		text += fmt.Sprintf(" and %d more", n)
	}
	return text
}

// EvaluatePolicy is the program's evaluation of one point of the port
// space (c/policy.c, evaluate), in Go: cp is the pod's longest matching
// cluster value, np its NetworkPolicy value (nil: no key), strict the
// enforcing mode. It decides as the program does but for connection
// tracking, which it leaves out. Strict mode denies at the default step
// only a pod without a NetworkPolicy key (one a NetworkPolicy selects
// without isolating the direction is allowed).
func EvaluatePolicy(cp, np *PolicyValue, k uint32, strict bool) PolicyResult {
	var base Outcome
	baseIdx := -1
	if cp != nil {
		if i := cp.Search(k); i >= 0 {
			iv := cp.Intervals[i]
			switch iv.First.Action() {
			case ActionAccept:
				return PolicyResult{Allow: true, Reason: PolicyAdminAccept, Step: StepAdmin, Object: iv.First.Object(), Interval: i}
			case ActionDeny:
				return PolicyResult{Reason: PolicyAdminDeny, Step: StepAdmin, Object: iv.First.Object(), Interval: i}
			}
			base, baseIdx = iv.Second, i
		}
	}
	if np != nil && !np.NotIsolated {
		if i := np.Search(k); i >= 0 && np.Intervals[i].First.Action() == ActionAccept {
			return PolicyResult{Allow: true, Reason: PolicyAllowed, Step: StepNamespace, Object: np.Intervals[i].First.Object(), Interval: i}
		}
		return PolicyResult{Reason: PolicyDenied, Step: StepNamespace, Interval: -1}
	}
	switch base.Action() {
	case ActionAccept:
		return PolicyResult{Allow: true, Reason: PolicyBaselineAccept, Step: StepBaseline, Object: base.Object(), Interval: baseIdx}
	case ActionDeny:
		return PolicyResult{Reason: PolicyBaselineDeny, Step: StepBaseline, Object: base.Object(), Interval: baseIdx}
	}
	if strict && np == nil {
		return PolicyResult{Reason: PolicyStrict, Step: StepDefault, Interval: -1}
	}
	return PolicyResult{Allow: true, Reason: PolicyNoPolicy, Step: StepDefault, Interval: -1}
}

// TiersString is a cluster value as text: each interval's ports and the
// Admin and Baseline winners with their object ids ("tcp/80 admin
// deny#123; any baseline accept#456"), "-" for none.
func (v *PolicyValue) TiersString() string {
	if len(v.Intervals) == 0 {
		return "-"
	}
	var parts []string
	for i, iv := range v.Intervals {
		if i == shownIntervals {
			parts = append(parts, fmt.Sprintf("and %d more", len(v.Intervals)-i))
			break
		}
		text := IntervalText(iv)
		if iv.First.Action() != ActionNone {
			text += " admin " + iv.First.String()
		}
		if iv.Second.Action() != ActionNone {
			text += " baseline " + iv.Second.String()
		}
		parts = append(parts, text)
	}
	return strings.Join(parts, "; ")
}
