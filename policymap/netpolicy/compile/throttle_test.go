package compile

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// withFlowControl turns the deriver's flow control on, with chunks of
// chunk rows: the test plays the reconciler (reconcileRows).
func withFlowControl(chunk int) func(*policyDeriver) {
	return func(d *policyDeriver) { d.flow = flowControl{chunk: chunk} }
}

// reconcileRows plays the reconciler: the first n rows in revision order
// that are Pending or Refreshing get status, in one transaction (a round);
// a row changed meanwhile is left (compare and swap), as the reconciler
// does. It returns how many rows it set.
func (f *deriverFixture) reconcileRows(n int, status reconciler.Status) int {
	type row struct {
		e   *PolicyMapEntry
		rev statedb.Revision
	}
	var rows []row
	for e, rev := range f.entries.LowerBound(f.db.ReadTxn(), statedb.ByRevision[*PolicyMapEntry](0)) {
		if len(rows) == n {
			break
		}
		if e.Status.IsPendingOrRefreshing() {
			rows = append(rows, row{e, rev})
		}
	}
	wtxn := f.db.WriteTxn(f.entries)
	set := 0
	for _, r := range rows {
		if _, _, err := f.entries.CompareAndSwap(wtxn, r.rev, r.e.Clone().SetStatus(status)); err == nil {
			set++
		}
	}
	wtxn.Commit()
	return set
}

// flowSnapshot is what the flow tests look at: each pod's rows, how many
// of them are Done, the rows waiting for the reconciler (Pending or
// Refreshing), and the channel that closes on the table's next change.
type flowSnapshot struct {
	rows, waitingOf []int
	waiting         int
	watch           <-chan struct{}
}

func (f *deriverFixture) snapshot(pods ...netip.Addr) flowSnapshot {
	txn := f.db.ReadTxn()
	iter, watch := f.entries.AllWatch(txn)
	s := flowSnapshot{rows: make([]int, len(pods)), waitingOf: make([]int, len(pods)), watch: watch}
	for e := range iter {
		waiting := e.Status.IsPendingOrRefreshing()
		if waiting {
			s.waiting++
		}
		for i, p := range pods {
			if e.Pod == p {
				s.rows[i]++
				if waiting {
					s.waitingOf[i]++
				}
			}
		}
	}
	return s
}

// awaitRows waits until check holds on the rows of pods.
func (f *deriverFixture) awaitRows(t *testing.T, what string, check func(flowSnapshot) bool, pods ...netip.Addr) flowSnapshot {
	t.Helper()
	var s flowSnapshot
	celltest.Await(t, 20*time.Second, func() (bool, <-chan struct{}, string) {
		s = f.snapshot(pods...)
		return check(s), s.watch, fmt.Sprintf("%s: rows %v, %d waiting", what, s.rows, s.waiting)
	})
	return s
}

// reconcileAll plays the reconciler, a round of chunk/2 rows at a time,
// until the table holds want; at every step check holds (the window).
func (f *deriverFixture) reconcileAll(t *testing.T, status reconciler.Status, want []*PolicyMapEntry, check func(flowSnapshot), pods ...netip.Addr) {
	t.Helper()
	wantIDs := map[string]bool{}
	for _, e := range want {
		wantIDs[entryID(e)] = true
	}
	deadline := time.After(30 * time.Second)
	for {
		s := f.snapshot(pods...)
		check(s)
		txn := f.db.ReadTxn()
		same := f.entries.NumObjects(txn) == len(wantIDs)
		for e := range f.entries.All(txn) {
			same = same && wantIDs[entryID(e)]
		}
		if same && s.waiting == 0 {
			return
		}
		if s.waiting > 0 {
			f.reconcileRows(8, status)
			continue
		}
		select {
		case <-s.watch:
		case <-deadline:
			t.Fatalf("the table never held the %d rows wanted: rows %v, %d waiting", len(want), s.rows, s.waiting)
		}
	}
}

// TestDeriverFlowControl: with the reconciler stalled, the deriver writes
// no more than about two chunks of a large pod's rows; a small object
// written then is written at once, past the window, and reconciled while
// most of the large pod's rows are still to be written. As the reconciler
// goes on (marking rows Done, or Error as for a full map or a fault: both
// count as reconciled), the deriver never has more than the window ahead
// of it, and the table is initialized only once every row is written.
func TestDeriverFlowControl(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status func() reconciler.Status
	}{
		{"done", reconciler.StatusDone},
		{"error", func() reconciler.Status { return reconciler.StatusError(errors.New("no space left on device")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const chunk = 64
			f := startDeriver(t, nodeconfig.Config{EnableIPv4: true}, withFlowControl(chunk))
			large, small := bigObject("large", 1000, 1), smallObject()
			lp, sp := large.Pods[0].PodIP, small.Pods[0].PodIP
			largeWant := CompilePod(lp, []*endpoints.PolicyEndpoint{large})
			smallWant := CompilePod(sp, []*endpoints.PolicyEndpoint{small})
			if len(largeWant) < 10*chunk {
				t.Fatalf("the large pod has %d entries: too few for the test", len(largeWant))
			}

			f.write(false, large)
			f.awaitRows(t, "the large pod's first rows", func(s flowSnapshot) bool { return s.rows[0] > 0 }, lp)
			f.write(false, small)
			s := f.awaitRows(t, "the small pod's rows", func(s flowSnapshot) bool { return s.rows[1] == len(smallWant) }, lp, sp)
			// The deriver has taken the later change: it had its chance to
			// write more of the large pod, and must not have.
			if s.rows[0] > 2*chunk {
				t.Fatalf("%d of the large pod's %d rows written ahead of a stalled reconciler; want at most %d", s.rows[0], len(largeWant), 2*chunk)
			}
			if ok, _ := f.entries.Initialized(f.db.ReadTxn()); ok {
				t.Fatal("policy-map-entries initialized before the large pod's rows are written")
			}

			smallDoneWith := -1 // the large pod's rows when the small one's are reconciled
			f.reconcileAll(t, tc.status(), append(largeWant, smallWant...), func(s flowSnapshot) {
				if s.waiting > 2*chunk+len(smallWant) {
					t.Fatalf("%d rows wait for the reconciler; the window is %d", s.waiting, 2*chunk)
				}
				if smallDoneWith < 0 && s.rows[1] == len(smallWant) && s.waitingOf[1] == 0 {
					smallDoneWith = s.rows[0]
				}
			}, lp, sp)
			if smallDoneWith < 0 || smallDoneWith >= len(largeWant) {
				t.Errorf("the small pod's rows were reconciled with %d of the large pod's %d rows written; want them before", smallDoneWith, len(largeWant))
			}
			if ok, _ := f.entries.Initialized(f.db.ReadTxn()); !ok {
				t.Error("policy-map-entries not initialized once every row is written")
			}
		})
	}
}

// TestDeriverFlowControlRowsChangedWhileWaiting: the rows the deriver
// waits on are written again (the object changes) or deleted (the object
// goes) before the reconciler gets to them: the wait does not hang, and
// the table ends as the objects say.
func TestDeriverFlowControlRowsChangedWhileWaiting(t *testing.T) {
	const chunk = 64
	f := startDeriver(t, nodeconfig.Config{EnableIPv4: true}, withFlowControl(chunk))
	large := bigObject("large", 1000, 1)
	lp := large.Pods[0].PodIP
	f.write(false, large)
	f.awaitRows(t, "the large pod's first rows", func(s flowSnapshot) bool { return s.rows[0] > 0 }, lp)

	// Written again: another port for every rule.
	changed := bigObject("large", 1000, 1)
	for i := range changed.Egress {
		for j := range changed.Egress[i].Ports {
			changed.Egress[i].Ports[j].Port++
		}
	}
	f.write(false, changed)
	want := CompilePod(lp, []*endpoints.PolicyEndpoint{changed})
	f.reconcileAll(t, reconciler.StatusDone(), want, func(flowSnapshot) {}, lp)

	// Deleted while the deriver waits on its rows (a change written,
	// not reconciled).
	f.write(false, large)
	f.awaitRows(t, "the large pod's rows written again", func(s flowSnapshot) bool { return s.waiting > 0 }, lp)
	f.write(true, large)
	f.reconcileAll(t, reconciler.StatusDone(), nil, func(flowSnapshot) {}, lp)
}

// TestDeriverFlowControlDeletions: deleting a large pod's rows is held
// back too (a transaction that only deletes probes the reconciler with a
// row marked Refreshing): with the reconciler stalled, at most about two
// chunks of the rows go, and a small object written then is written at
// once.
func TestDeriverFlowControlDeletions(t *testing.T) {
	const chunk = 64
	f := startDeriver(t, nodeconfig.Config{EnableIPv4: true}, withFlowControl(chunk))
	large, small := bigObject("large", 1000, 1), smallObject()
	lp, sp := large.Pods[0].PodIP, small.Pods[0].PodIP
	largeWant := CompilePod(lp, []*endpoints.PolicyEndpoint{large})
	smallWant := CompilePod(sp, []*endpoints.PolicyEndpoint{small})
	f.write(false, large)
	f.reconcileAll(t, reconciler.StatusDone(), largeWant, func(flowSnapshot) {}, lp)

	f.write(true, large)
	f.awaitRows(t, "the first deletions", func(s flowSnapshot) bool { return s.rows[0] < len(largeWant) }, lp)
	f.write(false, small)
	s := f.awaitRows(t, "the small pod's rows", func(s flowSnapshot) bool { return s.rows[1] == len(smallWant) }, lp, sp)
	if deleted := len(largeWant) - s.rows[0]; deleted > 2*chunk {
		t.Fatalf("%d of the large pod's %d rows deleted ahead of a stalled reconciler; want at most %d", deleted, len(largeWant), 2*chunk)
	}
	f.reconcileAll(t, reconciler.StatusDone(), smallWant, func(flowSnapshot) {}, lp, sp)
}

// TestDeriverFlowControlStopsWhileWaiting: the deriver waiting for a
// stalled reconciler stops at once when its context is done.
func TestDeriverFlowControlStopsWhileWaiting(t *testing.T) {
	f := startDeriver(t, nodeconfig.Config{EnableIPv4: true}, withFlowControl(64))
	large := bigObject("large", 1000, 1)
	f.write(false, large)
	f.awaitRows(t, "the large pod's first rows", func(s flowSnapshot) bool { return s.rows[0] > 0 }, large.Pods[0].PodIP)
	stopped := make(chan struct{})
	go func() { f.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the deriver did not stop while waiting for the reconciler")
	}
}

// gatedMap holds the reconciler's writes to a map until the gate opens,
// and counts the keys written before the first of a set of keys.
type gatedMap struct {
	bpf.Map
	first   map[string]bool // the keys whose first write is looked for
	once    sync.Once
	blocked chan struct{} // closed when a write first waits
	gate    chan struct{} // closed: writes go through

	mu      sync.Mutex
	written int // keys written so far
	before  int // keys written before the first of first; -1: none yet
}

func newGatedMap(m bpf.Map, first []*PolicyMapEntry) *gatedMap {
	g := &gatedMap{Map: m, first: map[string]bool{}, blocked: make(chan struct{}), gate: make(chan struct{}), before: -1}
	for _, e := range first {
		g.first[string(bpf.PolicyKeyVersionless(e.MapKey()))] = true
	}
	return g
}

func (g *gatedMap) open() {
	select {
	case <-g.gate:
	default:
		close(g.gate)
	}
}

func (g *gatedMap) wait(keys [][]byte) {
	select {
	case <-g.gate:
	default:
		g.once.Do(func() { close(g.blocked) })
		<-g.gate
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range keys {
		if g.before < 0 && g.first[string(bpf.PolicyKeyVersionless(k))] {
			g.before = g.written
		}
		g.written++
	}
}

func (g *gatedMap) Put(key, value any) error {
	g.wait([][]byte{key.([]byte)})
	return g.Map.Put(key, value)
}

func (g *gatedMap) BatchUpdate(keys, values any, opts *ebpf.BatchOptions) (int, error) {
	g.wait(byteSlices(keys))
	return g.Map.BatchUpdate(keys, values, opts)
}

func (g *gatedMap) writtenBefore() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.before
}

// podRows counts the rows of pod in policy-map-entries.
func (h *policyHarness) podRows(pod netip.Addr) (int, <-chan struct{}) {
	iter, watch := h.entries.PrefixWatch(h.db.ReadTxn(), PodEntries(pod))
	n := 0
	for range iter {
		n++
	}
	return n, watch
}

// TestPrivilegedSmallPolicyNotQueuedBehindALargeOne: with the reconciler
// and the kernel maps, a one-rule PolicyEndpoint written while a
// 20,000-rule one is being written and reconciled reaches the kernel
// after at most about two chunks of the large one's entries, not after
// all of them. The egress map holds the reconciler's writes until the
// small one is in the table, so that the large one's rows are all still
// to be reconciled then.
func TestPrivilegedSmallPolicyNotQueuedBehindALargeOne(t *testing.T) {
	h := startPolicyHarness(t, harnessOptions{})
	large, small := bigObject("large", 20000, 1), smallObject()
	lp, sp := large.Pods[0].PodIP, small.Pods[0].PodIP
	largeWant := CompilePod(lp, []*endpoints.PolicyEndpoint{large})
	smallWant := CompilePod(sp, []*endpoints.PolicyEndpoint{small})
	var largeEgress int
	for _, e := range largeWant {
		if e.Map() == policybpf.PolicyEgressV4MapName {
			largeEgress++
		}
	}
	gate := newGatedMap(h.kernelMaps()[policybpf.PolicyEgressV4MapName], smallWant)
	h.ops.Interpose(policybpf.PolicyEgressV4MapName, gate)
	t.Cleanup(gate.open) // before the hive stops

	h.setEndpoints([]*endpoints.PolicyEndpoint{large})
	select {
	case <-gate.blocked:
	case <-time.After(20 * time.Second):
		t.Fatal("the reconciler never wrote the large pod's entries")
	}
	wtxn := h.db.WriteTxn(h.endpoints)
	h.endpoints.Insert(wtxn, small)
	wtxn.Commit()
	celltest.Await(t, 20*time.Second, func() (bool, <-chan struct{}, string) {
		n, watch := h.podRows(sp)
		return n == len(smallWant), watch, fmt.Sprintf("the small pod has %d rows, want %d", n, len(smallWant))
	})
	if n, _ := h.podRows(lp); n > 2*chunkEntries {
		t.Fatalf("%d of the large pod's %d rows written ahead of a held reconciler; want at most %d", n, len(largeWant), 2*chunkEntries)
	}

	gate.open()
	h.waitPod(sp, smallWant)
	before := gate.writtenBefore()
	t.Logf("the small pod's first entry reached the kernel after %d of the large pod's %d egress entries", before, largeEgress)
	if before < 0 || before > 2*chunkEntries {
		t.Errorf("the small pod's entries reached the kernel after %d of the large pod's %d egress entries; want at most %d",
			before, largeEgress, 2*chunkEntries)
	}
	h.waitConverged(append(largeWant, smallWant...))
}

// TestPrivilegedFlowControlWithTheKernelRefusing: every entry of a large
// pod fails in the kernel (a fault, as a full map does): its rows are in
// Error, which counts as reconciled, so the deriver writes them all and a
// small object after them reaches the kernel; once the fault goes, the
// large pod's entries are retried in.
func TestPrivilegedFlowControlWithTheKernelRefusing(t *testing.T) {
	h := startPolicyHarness(t, harnessOptions{})
	large, small := bigObject("large", 20000, 1), smallObject()
	lp, sp := large.Pods[0].PodIP, small.Pods[0].PodIP
	largeWant := CompilePod(lp, []*endpoints.PolicyEndpoint{large})
	smallWant := CompilePod(sp, []*endpoints.PolicyEndpoint{small})
	refused := map[string]bool{}
	for _, e := range largeWant {
		refused[string(e.MapKey())] = true
	}
	h.ops.Faults().SetFaultFunc(func(_ string, key []byte) error {
		if refused[string(bpf.PolicyKeyVersionless(key))] {
			return errors.New("refused by the test")
		}
		return nil
	})

	h.setEndpoints([]*endpoints.PolicyEndpoint{large})
	celltest.Await(t, 30*time.Second, func() (bool, <-chan struct{}, string) {
		iter, watch := h.entries.PrefixWatch(h.db.ReadTxn(), PodEntries(lp))
		n, failed := 0, 0
		for e := range iter {
			n++
			if e.Status.Kind == reconciler.StatusKindError {
				failed++
			}
		}
		return n == len(largeWant) && failed == n, watch, fmt.Sprintf("the large pod has %d rows, %d in Error; want %d, all", n, failed, len(largeWant))
	})
	wtxn := h.db.WriteTxn(h.endpoints)
	h.endpoints.Insert(wtxn, small)
	wtxn.Commit()
	h.waitPod(sp, smallWant)

	h.ops.Faults().SetFaultFunc(nil)
	h.waitConverged(append(largeWant, smallWant...))
}
