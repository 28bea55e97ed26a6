package enforce

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
)

// forgetOneByOne is ForgetPolicyConnections as it was: a walk key by key
// (BPF_MAP_GET_NEXT_KEY), then a delete a key; the benchmark's "before".
func forgetOneByOne(m *ebpf.Map, forget func(policybpf.PolicyConnection) bool) (int, error) {
	var stale [][]byte
	key := make([]byte, m.KeySize())
	var cursor any
	for range m.MaxEntries() + 1 {
		if err := m.NextKey(cursor, key); err != nil {
			if !errors.Is(err, ebpf.ErrKeyNotExist) {
				return 0, err
			}
			break
		}
		if c, ok := policybpf.ParsePolicyCTKey(key); !ok || forget(c) {
			stale = append(stale, slices.Clone(key))
		}
		cursor = slices.Clone(key)
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, err
		}
	}
	return len(stale), nil
}

// BenchmarkForgetManyPods: 64 pods go at once (a node drained) from a
// connection-tracking map of 512k connections (8192 pods, 64 each, made
// by the program itself). Before: one walk per pod, key by key (64 x
// Delete with the old ForgetPolicyConnections); after: the reconciler's
// batch, one batched walk (DeleteBatch). The floor is one raw batched
// read of the whole map (BPF_MAP_LOOKUP_BATCH) in the same run.
func BenchmarkForgetManyPods(b *testing.B) {
	const pods, perPod, gone = 8192, 64, 64
	progs, _ := privilegedPrograms(b, Settings{Mode: policybpf.PolicyModeStandard, ConntrackMax: policybpf.PolicyDefaultConntrackMax})
	// Each pod's policy allows UDP 53 to the peer: what it allows is
	// tracked.
	policy := map[string]*ebpf.Map{}
	for _, name := range policybpf.PolicyMapNames {
		d, f, _ := policybpf.ParsePolicyMapName(name)
		m, err := ebpf.NewMap(policybpf.PolicyMapSpec(d, f, 2*pods))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		policy[name] = m
	}
	progs.maps = func(context.Context) (map[string]*ebpf.Map, error) { return policy, nil }
	val, _, _ := policybpf.AllowValue(policybpf.PortEntry{Protocol: policybpf.ProtocolUDP, StartPort: 53}).Encode()
	for i := range pods {
		key, _ := bpf.EncodePolicyKey(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), netip.MustParsePrefix("10.200.0.1/32"))
		if err := policy[policybpf.PolicyEgressV4MapName].Put(key, val); err != nil {
			b.Fatal(err)
		}
	}
	prog, err := progs.get(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	ct, err := progs.ct()
	if err != nil {
		b.Fatal(err)
	}
	peer := netip.MustParseAddr("10.200.0.1")
	podAddr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}) }
	open := func(i int) {
		for c := range perPod {
			frame, _ := policybpf.PolicyTestFrame(podAddr(i), peer, uint8(policybpf.ProtocolUDP), uint16(30000+c), 53)
			if res, err := prog.Run(policybpf.Egress, frame); err != nil || !res.Allow {
				b.Fatalf("open a connection: %+v %v", res, err)
			}
		}
	}
	start := time.Now()
	for i := range pods {
		open(i)
	}
	n, _ := policybpf.PolicyConnections(ct)
	b.Logf("%d connections tracked (map of %d) in %s", n, ct.MaxEntries(), time.Since(start))
	o := &bindingOps{log: slog.New(slog.DiscardHandler), progs: progs}
	batch := func() []reconciler.BatchEntry[*Binding] {
		var out []reconciler.BatchEntry[*Binding]
		for i := range gone {
			out = append(out, reconciler.BatchEntry[*Binding]{Object: &Binding{Addr: podAddr(i), Device: "enq", Ifindex: 1}})
		}
		return out
	}
	refill := func() {
		for i := range gone {
			open(i)
		}
	}
	floor := func() time.Duration {
		t := time.Now()
		keys := rawEntriesForBench(4096, int(ct.KeySize()))
		vs := rawEntriesForBench(4096, int(ct.ValueSize()))
		var cursor ebpf.MapBatchCursor
		for {
			_, err := ct.BatchLookup(&cursor, keys, vs, nil)
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(t)
	}
	for b.Loop() {
		b.StopTimer()
		f := floor()
		t := time.Now()
		real := forgetPolicyConnections
		forgetPolicyConnections = forgetOneByOne
		for _, e := range batch() {
			if err := o.Delete(context.Background(), nil, 0, e.Object); err != nil {
				b.Fatal(err)
			}
		}
		forgetPolicyConnections = real
		before := time.Since(t)
		refill()
		b.StartTimer()
		t = time.Now()
		bt := batch()
		o.DeleteBatch(context.Background(), nil, bt)
		after := time.Since(t)
		b.StopTimer()
		for _, e := range bt {
			if e.Result != nil {
				b.Fatal(e.Result)
			}
		}
		refill()
		b.StartTimer()
		b.ReportMetric(float64(f.Milliseconds()), "floor-ms")
		b.ReportMetric(float64(before.Milliseconds()), "before-ms")
		b.ReportMetric(float64(after.Milliseconds()), "after-ms")
		b.ReportMetric(float64(before)/float64(after), "before-x-after")
		b.ReportMetric(float64(after)/float64(f), "after-x-floor")
	}
}

// rawEntriesForBench is a slice of n elements of size bytes.
func rawEntriesForBench(n, size int) any {
	return reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(size, reflect.TypeFor[byte]())), n, n).Interface()
}
