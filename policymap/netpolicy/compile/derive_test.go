package compile

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// deriverFixture runs a policyDeriver on fresh tables, without maps.
type deriverFixture struct {
	db        *statedb.DB
	endpoints statedb.RWTable[*endpoints.PolicyEndpoint]
	entries   statedb.RWTable[*PolicyMapEntry]
	initPEs   func(statedb.WriteTxn)
	health    *celltest.Health // the deriver's reports
	stop      func()           // stops the deriver; also at the end of the test
	versions  statedb.Table[*PodVersions]
	// auto: the fixture plays the reconciler (rows are Done at once).
	auto bool
}

// startDeriver starts a deriver; opts set its fields before it runs. No
// reconciler is behind its table, so its flow control is off unless an
// option turns it on (withReconciler).
func startDeriver(t testing.TB, node nodeconfig.Config, opts ...func(*policyDeriver)) *deriverFixture {
	t.Helper()
	db := statedb.New()
	eps, err := endpoints.NewPolicyEndpointsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	ents, err := NewPolicyMapEntriesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	vt := newVersionsFixture(t, db, eps, ents)
	wtxn := db.WriteTxn(eps, ents)
	initPEs := eps.RegisterInitializer(wtxn, "test-source")
	initEntries := ents.RegisterInitializer(wtxn, "derive")
	wtxn.Commit()
	d := &policyDeriver{log: slog.New(slog.DiscardHandler), db: db, endpoints: eps, entries: ents, node: node, initDone: initEntries,
		flow: flowControl{off: true}, versions: vt.versions, state: vt.state}
	for _, o := range opts {
		o(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 3)
	health := &celltest.Health{}
	go func() { done <- d.run(ctx, health) }()
	// The switch brings each pod's new version into force once its rows
	// are Done; with the flow control off no reconciler is behind the
	// table, and the rows are Done at once.
	go func() { done <- vt.run(ctx, d.flow.off) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			for range 2 {
				if err := <-done; err != nil {
					t.Error(err)
				}
			}
		})
	}
	t.Cleanup(stop)
	return &deriverFixture{db: db, endpoints: eps, entries: ents, initPEs: initPEs, health: health, stop: stop,
		versions: vt.versions, auto: d.flow.off}
}

// write inserts (or, with del, deletes) objects in one transaction,
// marking policy-endpoints initialized.
func (f *deriverFixture) write(del bool, pes ...*endpoints.PolicyEndpoint) {
	wtxn := f.db.WriteTxn(f.endpoints)
	for _, pe := range pes {
		if del {
			f.endpoints.Delete(wtxn, pe)
		} else {
			f.endpoints.Insert(wtxn, pe)
		}
	}
	if f.initPEs != nil {
		f.initPEs(wtxn)
		f.initPEs = nil
	}
	wtxn.Commit()
}

// waitFor waits until the entries equal want (by desired bytes) and
// returns their revisions by entry ID.
func (f *deriverFixture) waitFor(t *testing.T, want []*PolicyMapEntry) map[string]statedb.Revision {
	t.Helper()
	wantIDs := map[string]bool{}
	for _, e := range want {
		wantIDs[entryID(e)] = true
	}
	deadline := time.After(10 * time.Second)
	for {
		iter, watch := f.entries.AllWatch(f.db.ReadTxn())
		var versionsWatch <-chan struct{}
		revs := map[string]statedb.Revision{}
		for e, rev := range iter {
			revs[entryID(e)] = rev
		}
		ok := len(revs) == len(wantIDs)
		for id := range revs {
			ok = ok && wantIDs[id]
		}
		if f.auto { // settled: every row Done and in force
			for e := range iter {
				ok = ok && e.Status.Kind == reconciler.StatusKindDone
			}
			vs, vw := f.versions.AllWatch(f.db.ReadTxn())
			for v := range vs {
				ok = ok && v.settled()
			}
			versionsWatch = vw
		}
		if ok {
			return revs
		}
		select {
		case <-watch:
		case <-versionsWatch:
		case <-deadline:
			var vs []string
			for v := range f.versions.All(f.db.ReadTxn()) {
				vs = append(vs, fmt.Sprintf("%s %+v", strings.Join(v.TableRow(), " "), v.Tiers))
			}
			for e := range f.entries.All(f.db.ReadTxn()) {
				if e.Status.Kind != reconciler.StatusKindDone {
					vs = append(vs, strings.Join(e.TableRow(), " "))
				}
			}
			t.Fatalf("entries never matched: have %d, want %d; versions:\n%s", len(revs), len(wantIDs), strings.Join(vs, "\n"))
		}
	}
}

func benchPolicyEndpoint(i int, dst string) *endpoints.PolicyEndpoint {
	pod := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
	return &endpoints.PolicyEndpoint{
		Namespace: "ns", Name: fmt.Sprintf("pe-%d", i), PolicyRef: fmt.Sprintf("ns/p-%d", i),
		IsolatesEgress: true,
		Pods:           []endpoints.PodEndpoint{{PodIP: pod, HostIP: netip.MustParseAddr("10.255.0.1")}},
		Egress: []endpoints.Rule{
			{CIDR: netip.MustParsePrefix(dst), Ports: []endpoints.Port{{Protocol: 6, Port: 80}}},
			{CIDR: netip.MustParsePrefix("172.16.0.0/12"), Except: []netip.Prefix{netip.MustParsePrefix("172.16.1.0/24")}},
		},
	}
}

// TestDeriverTouchesOnlyChangedEntries: when one object changes, only the
// entries of its pod get a new revision (and so reach the reconciler): its
// new version, whole; the entries of every other pod keep theirs.
func TestDeriverTouchesOnlyChangedEntries(t *testing.T) {
	f := startDeriver(t, nodeconfig.Config{EnableIPv4: true})
	var pes []*endpoints.PolicyEndpoint
	var want []*PolicyMapEntry
	for i := range 100 {
		pe := benchPolicyEndpoint(i, "10.1.0.7/32")
		pes = append(pes, pe)
		want = append(want, CompilePod(pe.Pods[0].PodIP, []*endpoints.PolicyEndpoint{pe})...)
	}
	if ok, _ := f.entries.Initialized(f.db.ReadTxn()); ok {
		t.Fatal("entries initialized before policy-endpoints")
	}
	f.write(false, pes...)
	before := f.waitFor(t, want)
	if ok, _ := f.entries.Initialized(f.db.ReadTxn()); !ok {
		t.Fatal("entries not initialized after policy-endpoints")
	}

	// Pod 42's destination 10.1.0.7 becomes 10.1.0.8: one entry deleted,
	// one added, the others untouched.
	changed := benchPolicyEndpoint(42, "10.1.0.8/32")
	oldEntries := CompilePod(pes[42].Pods[0].PodIP, pes[42:43])
	newEntries := CompilePod(changed.Pods[0].PodIP, []*endpoints.PolicyEndpoint{changed})
	want = want[:0]
	for i, pe := range pes {
		if i == 42 {
			pe = changed
		}
		want = append(want, CompilePod(pe.Pods[0].PodIP, []*endpoints.PolicyEndpoint{pe})...)
	}
	f.write(false, changed)
	after := f.waitFor(t, want)

	written := 0
	for id, rev := range after {
		if old, ok := before[id]; !ok || old != rev {
			written++
		}
	}
	newIDs := map[string]bool{}
	for _, e := range newEntries {
		newIDs[entryID(e)] = true
	}
	removed := 0
	for _, e := range oldEntries {
		if !newIDs[entryID(e)] {
			removed++
		}
	}
	// A change costs what changed: one /32 for another is safe in place
	// (edit.go), so the version in force is edited: one entry written, one
	// removed; the other pods' are untouched.
	if written != 1 || removed != 1 || len(after) != len(before) {
		t.Errorf("%d entries written, %d removed (of %d, then %d); want 1 and 1 (an edit in place)", written, removed, len(before), len(after))
	}

	// The object is deleted: exactly its pod's entries go.
	f.write(true, changed)
	want = want[:0]
	for i, pe := range pes {
		if i != 42 {
			want = append(want, CompilePod(pe.Pods[0].PodIP, []*endpoints.PolicyEndpoint{pe})...)
		}
	}
	final := f.waitFor(t, want)
	for id, rev := range final {
		if after[id] != rev {
			t.Errorf("entry %s rewritten by the deletion of another pod's object", id)
		}
	}
}

// markDone sets every entry Done, as the reconciler would once the kernel
// holds them: in rounds of 1000 entries, a transaction each. (A table
// keeps the nodes of its previous version until its next write: one
// transaction rewriting every row would hold two copies of the table.)
func (f *deriverFixture) markDone() {
	rows := statedb.Collect(f.entries.All(f.db.ReadTxn()))
	for chunk := range slices.Chunk(rows, 1000) {
		wtxn := f.db.WriteTxn(f.entries)
		for _, e := range chunk {
			f.entries.Insert(wtxn, e.Clone().SetStatus(reconciler.StatusDone()))
		}
		wtxn.Commit()
	}
}

// returnsMemory makes the deriver report to calls, when it returns memory
// (after changes of at least after entries), how many entries the table
// holds and how many of them are Pending.
func returnsMemory(after int, calls chan<- [2]int) func(*policyDeriver) {
	return func(d *policyDeriver) {
		d.returnMemoryAfter = after
		d.returnMemory = func() {
			var n [2]int
			for e := range d.entries.All(d.db.ReadTxn()) {
				n[0]++
				if e.Status.Kind == reconciler.StatusKindPending {
					n[1]++
				}
			}
			calls <- n
		}
	}
}

// TestDeriverReturnsMemoryOnceTheChangeIsInTheKernel: after a large change
// the deriver gives freed memory back to the OS, but only once the
// reconciler has written every entry (before, the reconciler's own
// garbage is still to come); a small change does not.
func TestDeriverReturnsMemoryOnceTheChangeIsInTheKernel(t *testing.T) {
	calls := make(chan [2]int, 2)
	f := startDeriver(t, nodeconfig.Config{EnableIPv4: true}, returnsMemory(50, calls))
	small := benchPolicyEndpoint(0, "10.1.0.7/32")
	smallEntries := len(CompilePod(small.Pods[0].PodIP, []*endpoints.PolicyEndpoint{small}))
	f.write(false, small)
	waitNumEntries(t, f, smallEntries)
	f.markDone()

	large := bigObject("large", 2, 20)
	want := smallEntries + 20*len(CompilePod(large.Pods[0].PodIP, []*endpoints.PolicyEndpoint{large}))
	f.write(false, large)
	waitNumEntries(t, f, want)
	f.markDone()
	select {
	case n := <-calls:
		if n != [2]int{want, 0} {
			t.Fatalf("memory returned with %d entries, %d of them Pending; want %d, none Pending", n[0], n[1], want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("memory not returned after a large change")
	}
}
