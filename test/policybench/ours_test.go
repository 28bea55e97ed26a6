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
	"github.com/enimasq/enimasq/bpf/policybpf"
)

func ourFrame(tb testing.TB, port uint16) []byte {
	tb.Helper()
	f, err := policybpf.PolicyTestFrame(pod, peer, uint8(policybpf.ProtocolTCP), 40000, port)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// ports are n TCP port entries (entryPort).
func ports(n int) []policybpf.PortEntry {
	out := make([]policybpf.PortEntry, n)
	for i := range out {
		out[i] = policybpf.PortEntry{Protocol: policybpf.ProtocolTCP, StartPort: uint32(entryPort(i))}
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
	prog     *policybpf.PolicyProgram
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
	spec, err := policybpf.PolicyStateSpec(name)
	if err != nil {
		tb.Fatal(err)
	}
	if name == policybpf.PolicyCTMapName {
		spec.MaxEntries = mapEntries
	}
	return newMap(tb, spec)
}

// oursVersion is the version of the pod's policy in force.
const oursVersion = 7

// newOurs loads the program with the NetworkPolicy entries on each of the
// pod's peer prefixes and, if cp is not nil, cp on its cluster key
// (clusterPeer).
func newOurs(tb testing.TB, entries []policybpf.PortEntry, cp *policybpf.PolicyValue, mode policybpf.PolicyMode) *ours {
	tb.Helper()
	maps := map[string]*ebpf.Map{
		policybpf.PolicyEgressV4MapName:  newMap(tb, policybpf.PolicyMapSpec(policybpf.Egress, bpf.IPv4, mapEntries)),
		policybpf.ClusterEgressV4MapName: newMap(tb, policybpf.ClusterMapSpec(policybpf.Egress, bpf.IPv4, mapEntries)),
		policybpf.PolicyChunksMapName:    newMap(tb, policybpf.ChunkMapSpec(policybpf.PolicyChunksMapName, policybpf.PolicyChunksDefaultMaxEntries)),
		policybpf.ClusterChunksMapName:   newMap(tb, policybpf.ChunkMapSpec(policybpf.ClusterChunksMapName, policybpf.PolicyChunksDefaultMaxEntries)),
	}
	for _, name := range []string{policybpf.PolicyCTMapName, policybpf.PolicyModeMapName, policybpf.PolicyVerdictsMapName, policybpf.PolicyEventsMapName} {
		maps[name] = stateMap(tb, name)
	}
	put := func(m, chunks *ebpf.Map, peer netip.Prefix, v *policybpf.PolicyValue) {
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
		key, err := bpf.AppendPolicyKeyVersion(nil, pod, oursVersion, peer)
		if err != nil {
			tb.Fatal(err)
		}
		if err := m.Put(key, val); err != nil {
			tb.Fatal(err)
		}
	}
	np := policybpf.AllowValue(entries...)
	if len(np.Intervals) != len(entries) {
		tb.Fatalf("%d entries made %d intervals", len(entries), len(np.Intervals))
	}
	for _, p := range peerPrefixes() {
		put(maps[policybpf.PolicyEgressV4MapName], maps[policybpf.PolicyChunksMapName], p, np)
	}
	if cp != nil {
		put(maps[policybpf.ClusterEgressV4MapName], maps[policybpf.ClusterChunksMapName], clusterPeer, cp)
	}
	if err := policybpf.SetPolicyMode(maps[policybpf.PolicyModeMapName], mode); err != nil {
		tb.Fatal(err)
	}
	// The pod's versions in force, as the agent writes them: the
	// NetworkPolicy tier at oursVersion, the cluster tier too when it has
	// rules (none otherwise).
	clusterVersion := policybpf.PolicyVersionNone
	if cp != nil {
		clusterVersion = oursVersion
	}
	versions, err := policybpf.PolicyVersionsSpec()
	if err != nil {
		tb.Fatal(err)
	}
	maps[policybpf.PolicyVersionsMapName] = newMap(tb, versions)
	if err := maps[policybpf.PolicyVersionsMapName].Put(policybpf.PolicyPodKey(pod), policybpf.EncodePolicyVersions(oursVersion, clusterVersion)); err != nil {
		tb.Fatal(err)
	}
	prog, err := policybpf.LoadPolicyProgram(maps)
	if err != nil {
		tb.Fatal(err)
	}
	o := &ours{prog: prog, events: maps[policybpf.PolicyEventsMapName], verdicts: maps[policybpf.PolicyVerdictsMapName]}
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
func (o *ours) check(tb testing.TB, frame []byte, reason policybpf.PolicyReason, step policybpf.PolicyStep) {
	tb.Helper()
	res, err := o.prog.Run(policybpf.Egress, frame)
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
	i := policybpf.VerdictCounterIndex(true, true, policybpf.StepNamespace)
	before, err := policybpf.ReadPolicyVerdicts(o.verdicts)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := timed(o.egress, denied, 1000, tcActShot); err != nil {
		tb.Fatal(err)
	}
	after, err := policybpf.ReadPolicyVerdicts(o.verdicts)
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
