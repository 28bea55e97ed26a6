package compile

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

const (
	benchPods  = 1000
	benchRules = 20
)

// benchPodIP is pod i's address, outside every rule's cidr.
func benchPodIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{100, 64, byte(i >> 8), byte(i)})
}

// benchObject is pod i's PolicyEndpoint: isolated both ways, 20 egress
// rules, each with an except that differs per pod and one or two port
// entries, and 2 ingress rules with excepts. variant changes one rule's
// cidr and except (a destination that moved).
func benchObject(i, variant int) *endpoints.PolicyEndpoint {
	pe := &endpoints.PolicyEndpoint{
		Namespace: "bench", Name: fmt.Sprintf("pod-%d", i), PolicyRef: fmt.Sprintf("bench/pod-%d", i),
		IsolatesIngress: true, IsolatesEgress: true,
		Pods: []endpoints.PodEndpoint{{Name: fmt.Sprintf("pod-%d", i), Namespace: "bench", PodIP: benchPodIP(i), HostIP: netip.MustParseAddr("100.127.0.1")}},
	}
	for j := range benchRules {
		cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(j), 0, 0}), 16)
		except := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(j), byte(i % 250), 0}), 24)
		if j == 0 && variant == 1 {
			cidr = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200, 0, 0}), 16)
			except = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200, byte(i % 250), 0}), 24)
		}
		r := endpoints.Rule{CIDR: cidr, Except: []netip.Prefix{except}, Ports: []endpoints.Port{{Protocol: policybpf.ProtocolTCP, Port: uint16(1000 + j)}}}
		if j%5 == 0 {
			r.Ports = append(r.Ports, endpoints.Port{Protocol: policybpf.ProtocolUDP, Port: 53}, endpoints.Port{Protocol: policybpf.ProtocolTCP, Port: 2000, EndPort: 2100})
		}
		pe.Egress = append(pe.Egress, r)
	}
	for j := range 2 {
		pe.Ingress = append(pe.Ingress, endpoints.Rule{
			CIDR:   netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16 + byte(j), 0, 0}), 16),
			Except: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16 + byte(j), 1, 0}), 24)},
			Ports:  []endpoints.Port{{Protocol: policybpf.ProtocolTCP, Port: 8080}},
		})
	}
	return pe
}

func benchObjects() []*endpoints.PolicyEndpoint {
	pes := make([]*endpoints.PolicyEndpoint, benchPods)
	for i := range pes {
		pes[i] = benchObject(i, 0)
	}
	return pes
}

// rawBatchUpdate is the floor: the entries written into fresh maps of the
// agent's specs with one BatchUpdate per map, pre-encoded.
func rawBatchUpdate(b *testing.B, entries []*PolicyMapEntry) time.Duration {
	b.Helper()
	byMap := map[string][]*PolicyMapEntry{}
	for _, e := range entries {
		byMap[e.Map()] = append(byMap[e.Map()], e)
	}
	var total time.Duration
	for name, es := range byMap {
		d, f, err := policybpf.ParsePolicyMapName(name)
		if err != nil {
			b.Fatal(err)
		}
		spec := policybpf.PolicyMapSpec(d, f, policybpf.PolicyDefaultMaxEntries)
		m, err := ebpf.NewMap(spec)
		if err != nil {
			b.Fatal(err)
		}
		keys := make([]byte, 0, len(es)*int(spec.KeySize))
		values := make([]byte, 0, len(es)*policybpf.PolicyValueSize)
		for _, e := range es {
			keys = append(keys, e.MapKey()...)
			values = append(values, e.MapValue()...)
		}
		ks, vs := asArrays(keys, int(spec.KeySize)), asArrays(values, policybpf.PolicyValueSize)
		runtime.GC()
		start := time.Now()
		n, err := m.BatchUpdate(ks, vs, nil)
		total += time.Since(start)
		m.Close()
		if err != nil || n != len(es) {
			b.Fatalf("raw BatchUpdate %s: %d of %d, %v", name, n, len(es), err)
		}
	}
	return total
}

// asArrays turns packed elements into a [][size]byte, which cilium/ebpf
// hands to the kernel without copying per element.
func asArrays(raw []byte, size int) any {
	n := len(raw) / size
	v := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(size, reflect.TypeFor[byte]())), n, n)
	if n > 0 {
		copy(unsafe.Slice((*byte)(v.UnsafePointer()), n*size), raw)
	}
	return v.Interface()
}

func compileBench(pes []*endpoints.PolicyEndpoint) []*PolicyMapEntry {
	var out []*PolicyMapEntry
	for _, pe := range pes {
		out = append(out, CompilePod(pe.Pods[0].PodIP, []*endpoints.PolicyEndpoint{pe})...)
	}
	return out
}

// BenchmarkPolicyCompile compiles 1000 pods with 20 rules with excepts
// each. ns/pod is the compile time per pod; floor-ns/pod is the time the
// kernel takes to write that pod's entries with a batch update; x-floor is
// their ratio: what compiling costs next to the least the kernel must do.
func BenchmarkPolicyCompile(b *testing.B) {
	celltest.RequireRoot(b)
	pes := benchObjects()
	entries := compileBench(pes)
	floor := rawBatchUpdate(b, entries)
	for range 2 {
		floor = min(floor, rawBatchUpdate(b, entries))
	}
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		for _, pe := range pes {
			CompilePod(pe.Pods[0].PodIP, []*endpoints.PolicyEndpoint{pe})
		}
	}
	perPod := float64(time.Since(start).Nanoseconds()) / float64(b.N*benchPods)
	floorPerPod := float64(floor.Nanoseconds()) / benchPods
	b.ReportMetric(perPod, "ns/pod")
	b.ReportMetric(float64(len(entries))/benchPods, "entries/pod")
	b.ReportMetric(floorPerPod, "floor-ns/pod")
	b.ReportMetric(perPod/floorPerPod, "x-floor")
}

// waitAllDone waits until policy-map-entries holds n entries and the
// reconciler has applied them all without failure.
func (h *policyHarness) waitAllDone(n int) {
	h.tb.Helper()
	celltest.Await(h.tb, 60*time.Second, func() (bool, <-chan struct{}, string) {
		txn := h.db.ReadTxn()
		_, watch := h.entries.AllWatch(txn)
		got := h.entries.NumObjects(txn)
		return got == n, watch, fmt.Sprintf("%d entries, want %d", got, n)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rev := h.entries.Revision(h.db.ReadTxn())
	_, low, err := h.state.reconciler.WaitUntilReconciled(ctx, rev)
	if err != nil {
		h.tb.Fatalf("wait for revision %d: %v", rev, err)
	}
	if low != 0 && low <= rev {
		h.tb.Fatalf("entries from revision %d failed", low)
	}
}

// BenchmarkPolicyFullSync programs 1000 pods x 20 rules with excepts into
// empty maps: from the objects' insertion into policy-endpoints until every
// entry is Done (compiled, written to the table, reconciled). x-floor is
// that time over the floor, the raw batch update of the same pre-encoded
// entries into empty maps.
func BenchmarkPolicyFullSync(b *testing.B) {
	celltest.RequireRoot(b)
	pes := benchObjects()
	entries := compileBench(pes)
	var floor, synced time.Duration
	b.ResetTimer()
	b.StopTimer()
	for range b.N {
		floor += rawBatchUpdate(b, entries)

		h := startPolicyHarness(b, harnessOptions{})
		runtime.GC()
		b.StartTimer()
		start := time.Now()
		h.setEndpoints(pes)
		h.waitAllDone(len(entries))
		synced += time.Since(start)
		b.StopTimer()
		h.stop()
	}
	b.ReportMetric(float64(len(entries)), "entries")
	b.ReportMetric(float64(floor.Nanoseconds())/float64(b.N), "floor-ns/op")
	b.ReportMetric(float64(synced)/float64(floor), "x-floor")
}

// countingMap counts the element operations the reconciler makes on a map
// (a batch of n counts n).
type countingMap struct {
	bpf.Map
	ops atomic.Int64
}

func (c *countingMap) Put(key, value any) error {
	c.ops.Add(1)
	return c.Map.Put(key, value)
}

func (c *countingMap) Delete(key any) error {
	c.ops.Add(1)
	return c.Map.Delete(key)
}

func (c *countingMap) BatchUpdate(keys, values any, opts *ebpf.BatchOptions) (int, error) {
	c.ops.Add(int64(reflect.ValueOf(keys).Len()))
	return c.Map.BatchUpdate(keys, values, opts)
}

func (c *countingMap) BatchDelete(keys any, opts *ebpf.BatchOptions) (int, error) {
	c.ops.Add(int64(reflect.ValueOf(keys).Len()))
	return c.Map.BatchDelete(keys, opts)
}

// changedEntries counts the entries that differ between two compilations
// of a pod: added, removed, or with other bytes.
func changedEntries(before, after []*PolicyMapEntry) int {
	ids := func(es []*PolicyMapEntry) map[string]bool {
		m := map[string]bool{}
		for _, e := range es {
			m[fmt.Sprintf("%s %x", e.Map(), e.MapKey())+" "+fmt.Sprintf("%x", e.MapValue())] = true
		}
		return m
	}
	a, b := ids(before), ids(after)
	n := 0
	for id := range a {
		if !b[id] {
			n++ // removed, or its value changed (counted once as an update)
		}
	}
	keysA := map[string]bool{}
	for _, e := range before {
		keysA[fmt.Sprintf("%s %x", e.Map(), e.MapKey())] = true
	}
	for _, e := range after {
		if !keysA[fmt.Sprintf("%s %x", e.Map(), e.MapKey())] {
			n++ // added
		}
	}
	return n
}

// waitPod waits until the pod IP's rows are exactly want, all Done. The
// reconciler applies a round's deletes before its updates and marks the
// updates Done after both, and the compiler writes a pod's deletes and
// inserts in one transaction: once the new rows are Done, the kernel is in
// step for the pod.
func (h *policyHarness) waitPod(pod netip.Addr, want []*PolicyMapEntry) {
	h.tb.Helper()
	wantIDs := map[string]bool{}
	for _, e := range want {
		wantIDs[entryID(e)] = true
	}
	celltest.Await(h.tb, 30*time.Second, func() (bool, <-chan struct{}, string) {
		iter, watch := h.entries.PrefixWatch(h.db.ReadTxn(), PodEntries(pod))
		n, ok := 0, true
		for e := range iter {
			n++
			ok = ok && wantIDs[entryID(e)] && e.Status.Kind == reconciler.StatusKindDone
		}
		return ok && n == len(wantIDs), watch, fmt.Sprintf("pod %s: entries never matched", pod)
	})
}

// rawChange is the floor of a change: the kernel deleting the keys that
// went and writing the entries that are new or changed, each in one batch,
// pre-encoded, into a map holding the old entries.
func rawChange(b *testing.B, m *ebpf.Map, before, after []*PolicyMapEntry) time.Duration {
	b.Helper()
	for _, e := range before {
		if err := m.Put(e.MapKey(), e.MapValue()); err != nil {
			b.Fatal(err)
		}
	}
	keep := map[string]bool{}
	for _, e := range after {
		keep[string(e.MapKey())] = true
	}
	had := map[string]string{}
	for _, e := range before {
		had[string(e.MapKey())] = string(e.MapValue())
	}
	var gone, newKeys, newValues []byte
	for _, e := range before {
		if !keep[string(e.MapKey())] {
			gone = append(gone, e.MapKey()...)
		}
	}
	for _, e := range after {
		if v, ok := had[string(e.MapKey())]; !ok || v != string(e.MapValue()) {
			newKeys = append(newKeys, e.MapKey()...)
			newValues = append(newValues, e.MapValue()...)
		}
	}
	ks := int(m.KeySize())
	runtime.GC()
	start := time.Now()
	if len(gone) > 0 {
		if _, err := m.BatchDelete(asArrays(gone, ks), nil); err != nil {
			b.Fatal(err)
		}
	}
	if len(newKeys) > 0 {
		if _, err := m.BatchUpdate(asArrays(newKeys, ks), asArrays(newValues, policybpf.PolicyValueSize), nil); err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	for _, e := range after {
		m.Delete(e.MapKey())
	}
	return elapsed
}

// BenchmarkPolicyOnePodChange: with 1000 pods programmed, one pod's
// PolicyEndpoint changes (a destination moves: one cidr and its except).
// map-ops is the number of element operations the maps saw and
// changed-entries the number of that pod's entries that differ; they must
// be equal (the benchmark fails otherwise). x-floor is the time from the
// write of the changed object into policy-endpoints until the kernel is in
// step, over the raw kernel operations for those entries.
func BenchmarkPolicyOnePodChange(b *testing.B) {
	celltest.RequireRoot(b)
	pes := benchObjects()
	entries := compileBench(pes)
	h := startPolicyHarness(b, harnessOptions{})
	counters := map[string]*countingMap{}
	for name, m := range h.kernelMaps() {
		c := &countingMap{Map: m}
		counters[name] = c
		h.ops.Interpose(name, c)
	}
	h.setEndpoints(pes)
	h.waitAllDone(len(entries))

	const target = benchPods / 2
	pod := benchPodIP(target)
	var variants [2][]*endpoints.PolicyEndpoint
	var compiled [2][]*PolicyMapEntry
	for v := range variants {
		variants[v] = append([]*endpoints.PolicyEndpoint(nil), pes...)
		variants[v][target] = benchObject(target, v)
		compiled[v] = CompilePod(pod, variants[v][target:target+1])
	}
	changed := changedEntries(compiled[0], compiled[1])
	for _, e := range append(append([]*PolicyMapEntry(nil), compiled[0]...), compiled[1]...) {
		if e.Map() != policybpf.PolicyEgressV4MapName && e.Peer().Bits() > 0 && !e.Peer().Contains(netip.MustParseAddr("100.127.0.1")) &&
			!e.Peer().Overlaps(netip.MustParsePrefix("172.16.0.0/15")) {
			b.Fatalf("unexpected entry %v", e.TableRow())
		}
	}
	floorMap, err := ebpf.NewMap(policybpf.PolicyMapSpec(policybpf.Egress, bpf.IPv4, policybpf.PolicyDefaultMaxEntries))
	if err != nil {
		b.Fatal(err)
	}
	defer floorMap.Close()
	egress := func(es []*PolicyMapEntry) []*PolicyMapEntry {
		var out []*PolicyMapEntry
		for _, e := range es {
			if e.Map() == policybpf.PolicyEgressV4MapName {
				out = append(out, e)
			}
		}
		return out
	}

	var synced, floor time.Duration
	var ops int64
	b.ResetTimer()
	b.StopTimer()
	for i := range b.N {
		cur, next := i%2, (i+1)%2
		for _, c := range counters {
			c.ops.Store(0)
		}
		runtime.GC()
		b.StartTimer()
		start := time.Now()
		wtxn := h.db.WriteTxn(h.endpoints)
		h.endpoints.Insert(wtxn, variants[next][target])
		wtxn.Commit()
		h.waitPod(pod, compiled[next])
		synced += time.Since(start)
		b.StopTimer()
		// The old version's rows are out of the table; their keys leave
		// the kernel as the reconciler gets to the deletions, after.
		want := int64(len(compiled[cur]) + len(compiled[next]))
		var got int64
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			got = 0
			for _, c := range counters {
				got += c.ops.Load()
			}
			if got >= want || time.Now().After(deadline) {
				break
			}
		}
		ops += got
		floor += rawChange(b, floorMap, egress(compiled[cur]), egress(compiled[next]))
	}
	b.ReportMetric(float64(ops)/float64(b.N), "map-ops")
	b.ReportMetric(float64(changed), "changed-entries")
	b.ReportMetric(float64(floor.Nanoseconds())/float64(b.N), "floor-ns/op")
	b.ReportMetric(float64(synced)/float64(floor), "x-floor")
	// A changed pod moves to a new version of its policy (Documentation/
	// network-policy.md, "Versions"): every entry of the new version is
	// written and every entry of the old one deleted, however few changed.
	if want := len(compiled[0]) + len(compiled[1]); ops != int64(want*b.N) {
		b.Fatalf("%d map operations per run where the two versions hold %d and %d entries (%d runs; %d entries changed)",
			ops/int64(b.N), len(compiled[0]), len(compiled[1]), b.N, changed)
	}
}
