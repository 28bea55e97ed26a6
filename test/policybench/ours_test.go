package policybench

import (
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/enimasq/enimasq/bpf"
)

func ourFrame(tb testing.TB, port uint16) []byte {
	tb.Helper()
	f, err := bpf.PolicyTestFrame(pod, peer, uint8(bpf.ProtocolTCP), 40000, port)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// ports are n TCP port entries (entryPort).
func ports(n int) []bpf.PortEntry {
	out := make([]bpf.PortEntry, n)
	for i := range out {
		out[i] = bpf.PortEntry{Protocol: bpf.ProtocolTCP, StartPort: uint32(entryPort(i))}
	}
	return out
}

// ours is enimasq's policy program with maps of its own: the egress IPv4
// NetworkPolicy and cluster maps, their chunk maps, tracking, mode,
// verdict counters and events (the others are the loader's placeholders).
type ours struct {
	egress   *ebpf.Program
	events   *ebpf.Map
	verdicts *ebpf.Map
	prog     *bpf.PolicyProgram
	reader   *ringbuf.Reader
}

func newMap(tb testing.TB, spec *ebpf.MapSpec) *ebpf.Map {
	tb.Helper()
	spec = spec.Copy()
	spec.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(spec)
	if err != nil {
		tb.Fatalf("map %s: %v", spec.Name, err)
	}
	tb.Cleanup(func() { m.Close() })
	return m
}

func stateMap(tb testing.TB, name string) *ebpf.Map {
	tb.Helper()
	spec, err := bpf.PolicyStateSpec(name)
	if err != nil {
		tb.Fatal(err)
	}
	if name == bpf.PolicyCTMapName {
		spec.MaxEntries = mapEntries
	}
	return newMap(tb, spec)
}

// newOurs loads the program with the NetworkPolicy entries on each of the
// pod's peer prefixes and, if cp is not nil, cp on its cluster key
// (clusterPeer).
func newOurs(tb testing.TB, entries []bpf.PortEntry, cp *bpf.PolicyValue, mode bpf.PolicyMode) *ours {
	tb.Helper()
	maps := map[string]*ebpf.Map{
		bpf.PolicyEgressV4MapName:  newMap(tb, bpf.PolicyMapSpec(bpf.Egress, bpf.IPv4, mapEntries)),
		bpf.ClusterEgressV4MapName: newMap(tb, bpf.ClusterMapSpec(bpf.Egress, bpf.IPv4, mapEntries)),
		bpf.PolicyChunksMapName:    newMap(tb, bpf.ChunkMapSpec(bpf.PolicyChunksMapName, bpf.PolicyChunksDefaultMaxEntries)),
		bpf.ClusterChunksMapName:   newMap(tb, bpf.ChunkMapSpec(bpf.ClusterChunksMapName, bpf.PolicyChunksDefaultMaxEntries)),
	}
	for _, name := range []string{bpf.PolicyCTMapName, bpf.PolicyModeMapName, bpf.PolicyVerdictsMapName, bpf.PolicyEventsMapName} {
		maps[name] = stateMap(tb, name)
	}
	put := func(m, chunks *ebpf.Map, peer netip.Prefix, v *bpf.PolicyValue) {
		tb.Helper()
		val, spill, err := v.Encode()
		if err != nil {
			tb.Fatal(err)
		}
		for _, c := range spill {
			if err := chunks.Put(c.Key, c.Value); err != nil {
				tb.Fatal(err)
			}
		}
		key, err := bpf.EncodePolicyKey(pod, peer)
		if err != nil {
			tb.Fatal(err)
		}
		if err := m.Put(key, val); err != nil {
			tb.Fatal(err)
		}
	}
	np := bpf.AllowValue(entries...)
	if len(np.Intervals) != len(entries) {
		tb.Fatalf("%d entries made %d intervals", len(entries), len(np.Intervals))
	}
	for _, p := range peerPrefixes() {
		put(maps[bpf.PolicyEgressV4MapName], maps[bpf.PolicyChunksMapName], p, np)
	}
	if cp != nil {
		put(maps[bpf.ClusterEgressV4MapName], maps[bpf.ClusterChunksMapName], clusterPeer, cp)
	}
	if err := bpf.SetPolicyMode(maps[bpf.PolicyModeMapName], mode); err != nil {
		tb.Fatal(err)
	}
	prog, err := bpf.LoadPolicyProgram(maps)
	if err != nil {
		tb.Fatal(err)
	}
	o := &ours{prog: prog, events: maps[bpf.PolicyEventsMapName], verdicts: maps[bpf.PolicyVerdictsMapName]}
	o.egress, _ = prog.Programs()
	tb.Cleanup(func() {
		if o.reader != nil {
			o.reader.Close()
		}
		prog.Close()
	})
	return o
}

// check runs frame once and checks the reason and step of the verdict.
func (o *ours) check(tb testing.TB, frame []byte, reason bpf.PolicyReason, step bpf.PolicyStep) {
	tb.Helper()
	res, err := o.prog.Run(bpf.Egress, frame)
	if err != nil {
		tb.Fatal(err)
	}
	if res.Reason != reason || res.Step != step {
		tb.Fatalf("verdict %+v (%s), want reason %d (%s), step %s", res, res.Reason, reason, reason, step)
	}
	if _, err := o.drain(); err != nil {
		tb.Fatal(err)
	}
}

// checkCounted checks that every decided packet counts (the program's one
// counter update a decision).
func (o *ours) checkCounted(tb testing.TB, denied []byte) {
	tb.Helper()
	i := bpf.VerdictCounterIndex(true, true, bpf.StepNamespace)
	before, err := bpf.ReadPolicyVerdicts(o.verdicts)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := timed(o.egress, denied, 1000, tcActShot); err != nil {
		tb.Fatal(err)
	}
	after, err := bpf.ReadPolicyVerdicts(o.verdicts)
	if err != nil {
		tb.Fatal(err)
	}
	if n := after[i] - before[i]; n != 1000 {
		tb.Fatalf("%d denials counted after 1000 runs", n)
	}
}

// drain reads and drops the records in the events ring.
func (o *ours) drain() (int, error) {
	if o.reader == nil {
		r, err := ringbuf.NewReader(o.events)
		if err != nil {
			return 0, err
		}
		o.reader = r
	}
	for n := 0; ; n++ {
		o.reader.SetDeadline(time.Now())
		if _, err := o.reader.Read(); errors.Is(err, os.ErrDeadlineExceeded) {
			return n, nil
		} else if err != nil {
			return n, err
		}
	}
}
