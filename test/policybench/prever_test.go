package policybench

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// The program before per-pod versions ("prever", preverCommit's object):
// today's values (intervals of (protocol << 16 | port) with outcomes, 32
// inline and the rest in chunks), today's steps, counters and events, but
// keys without a version, {u32 prefixlen = 32 + peer bits (host order);
// pod; peer} (network order): prevKey's layout. It needs no versions map
// (one lookup fewer a decided packet); its other maps are today's.
const (
	preverCommit = "672e45b"
	preverObject = "bpf/policy_bpfel.o"
	// preverKeySize is its IPv4 policy key: prefixlen, pod, peer.
	preverKeySize = 4 + 4 + 4
)

// Its reasons (skb->cb[0]) and steps (skb->cb[2]), as today's.
const (
	preverAllowed       = 1
	preverDenied        = 2
	preverTracked       = 5
	preverStepNone      = 0
	preverStepNamespace = 2
	preverNoInterval    = 0xffffffff
	// preverDeniedCounter is the index in its enimasq_policy_verdicts of
	// an egress denial at the NetworkPolicy step: 8 + 4 + step - 1.
	preverDeniedCounter = 8 + 4 + preverStepNamespace - 1
)

// preverSpec is the collection of the program before per-pod versions
// (preverCommit's object, read with git), or nil and why not: it must have
// policy_egress, an LPM trie enimasq_egress_v4 of 12-byte keys and today's
// values, today's chunks, mode, verdicts and tracking maps, and no versions
// map.
func preverSpec(tb testing.TB) (*ebpf.CollectionSpec, string) {
	tb.Helper()
	spec, why := gitSpec(tb, preverCommit, preverObject)
	if spec == nil {
		return nil, why
	}
	not := func(what string) (*ebpf.CollectionSpec, string) {
		return nil, fmt.Sprintf("%s of %s is not the program before per-pod versions: %s", preverObject, preverCommit, what)
	}
	if spec.Programs["policy_egress"] == nil {
		return not("no policy_egress")
	}
	m := spec.Maps[policybpf.PolicyEgressV4MapName]
	switch {
	case m == nil:
		return not("no " + policybpf.PolicyEgressV4MapName)
	case m.Type != ebpf.LPMTrie || m.KeySize != preverKeySize || m.ValueSize != policybpf.PolicyValueSize:
		return not(fmt.Sprintf("%s is a %s of %d-byte keys and %d-byte values, want an %s of %d and %d",
			m.Name, m.Type, m.KeySize, m.ValueSize, ebpf.LPMTrie, preverKeySize, policybpf.PolicyValueSize))
	}
	if c := spec.Maps[policybpf.PolicyChunksMapName]; c == nil || c.ValueSize != policybpf.PolicyChunkValueSize {
		return not("no " + policybpf.PolicyChunksMapName + " of today's chunks")
	}
	for _, name := range []string{policybpf.PolicyModeMapName, policybpf.PolicyVerdictsMapName, policybpf.PolicyCTMapName} {
		if spec.Maps[name] == nil {
			return not("no " + name)
		}
	}
	if spec.Maps[policybpf.PolicyVersionsMapName] != nil {
		return not("it has " + policybpf.PolicyVersionsMapName)
	}
	return spec, ""
}

// newPrever loads the program before per-pod versions with maps of its own
// (standard mode, events off), ours's value of n TCP port entries on each
// of the pod's peer prefixes (encoded by today's encoder: the layout is the
// same), and checks its verdicts.
func newPrever(tb testing.TB, spec *ebpf.CollectionSpec, n int) *ebpf.Program {
	tb.Helper()
	coll, err := ebpf.NewCollection(spec.Copy())
	if err != nil {
		tb.Fatalf("load the program of %s: %v", preverCommit, err)
	}
	tb.Cleanup(coll.Close)
	np := policybpf.AllowValue(ports(n)...)
	if len(np.Intervals) != n {
		tb.Fatalf("%d entries made %d intervals", n, len(np.Intervals))
	}
	val, spill, err := np.Encode()
	if err != nil {
		tb.Fatal(err)
	}
	for _, c := range spill {
		must(tb, coll.Maps[policybpf.PolicyChunksMapName].Put(c.Key, c.Value))
	}
	m := coll.Maps[policybpf.PolicyEgressV4MapName]
	for _, p := range peerPrefixes() {
		must(tb, m.Put(prevKey(pod, p), val))
	}
	must(tb, policybpf.SetPolicyMode(coll.Maps[policybpf.PolicyModeMapName], policybpf.PolicyModeStandard))

	prog := coll.Programs["policy_egress"]
	run := func(frame []byte, wantRet, wantReason, wantIdx, wantStep uint32) {
		tb.Helper()
		var in, out [48]uint32
		ret, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: &in, ContextOut: &out})
		if err != nil {
			tb.Fatal(err)
		}
		// skb->cb[0..2]: reason, interval, step.
		if ret != wantRet || out[12] != wantReason || out[13] != wantIdx || out[14] != wantStep {
			tb.Fatalf("program of %s: returned %#x, reason %d, interval %#x, step %d; want %#x, %d, %#x, %d",
				preverCommit, ret, out[12], out[13], out[14], wantRet, wantReason, wantIdx, wantStep)
		}
	}
	denied := ourFrame(tb, deniedPort(n))
	run(denied, tcActShot, preverDenied, preverNoInterval, preverStepNamespace)
	if n == 24 {
		// Every decided packet counts, as ours's.
		counted := func() uint64 {
			var perCPU []uint64
			must(tb, coll.Maps[policybpf.PolicyVerdictsMapName].Lookup(uint32(preverDeniedCounter), &perCPU))
			var sum uint64
			for _, v := range perCPU {
				sum += v
			}
			return sum
		}
		before := counted()
		if _, err := timed(prog, denied, 1000, tcActShot); err != nil {
			tb.Fatal(err)
		}
		if d := counted() - before; d != 1000 {
			tb.Fatalf("program of %s: %d denials counted after 1000 runs", preverCommit, d)
		}
		tracked := ourFrame(tb, lastPort(n))
		run(tracked, tcActUnspec, preverAllowed, uint32(n-1), preverStepNamespace)
		run(tracked, tcActUnspec, preverTracked, preverNoInterval, preverStepNone)
	}
	return prog
}
