package compile

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// smallObject is a one-rule PolicyEndpoint for one pod, 192.168.0.1.
func smallObject() *endpoints.PolicyEndpoint {
	return &endpoints.PolicyEndpoint{
		Namespace: "bench", Name: "small", PolicyRef: "bench/small", IsolatesEgress: true,
		Pods:   []endpoints.PodEndpoint{{PodIP: netip.MustParseAddr("192.168.0.1"), HostIP: netip.MustParseAddr("100.127.0.1")}},
		Egress: []endpoints.Rule{{CIDR: netip.MustParsePrefix("10.0.0.0/8"), Ports: []endpoints.Port{{Protocol: policybpf.ProtocolTCP, Port: 80}}}},
	}
}

// podEntries waits for a change of the table and returns how many
// entries each of the pods has.
func (f *deriverFixture) countPods(pods ...netip.Addr) ([]int, <-chan struct{}) {
	txn := f.db.ReadTxn()
	_, watch := f.entries.AllWatch(txn)
	out := make([]int, len(pods))
	for i, p := range pods {
		for range f.entries.Prefix(txn, PodEntries(p)) {
			out[i]++
		}
	}
	return out, watch
}

// TestSmallObjectNotHeldBehindLargeCompile: a one-rule object written
// just after a 50,000-rule one gets its entries first, while the large
// one still compiles; then the large one's entries come. The small one's
// latency is logged (BenchmarkPolicySmallDuringLargeCompile measures it
// with the kernel maps).
func TestSmallObjectNotHeldBehindLargeCompile(t *testing.T) {
	f := startDeriver(t, nodeconfig.Config{EnableIPv4: true})
	large, small := bigObject("large", 50000, 1), smallObject()
	lp, sp := large.Pods[0].PodIP, small.Pods[0].PodIP
	f.write(false, large)
	start := time.Now()
	f.write(false, small)
	var smallAt time.Duration
	deadline := time.After(60 * time.Second)
	for {
		n, watch := f.countPods(lp, sp)
		if n[1] > 0 && smallAt == 0 {
			smallAt = time.Since(start)
			if n[0] > 0 {
				t.Fatalf("the large object's %d entries were written before the small one's", n[0])
			}
		}
		if n[0] > 0 {
			if smallAt == 0 {
				t.Fatal("the large object's entries came first")
			}
			t.Logf("small object's entries after %s, the large one's after %s", smallAt, time.Since(start))
			return
		}
		select {
		case <-watch:
		case <-deadline:
			t.Fatalf("entries never came: %v", n)
		}
	}
}

// TestPodsShareCompiledValues: 50,000 pods of one object get their entries
// from one compilation: the values of equal entries of different pods are
// the same bytes, and the heap held by the table rows is logged per pod
// (BenchmarkPolicyManyPodsMemory reports it).
func TestPodsShareCompiledValues(t *testing.T) {
	pods := 50000
	if testing.Short() {
		pods = 5000
	}
	f := startDeriver(t, nodeconfig.Config{EnableIPv4: true})
	pe := bigObject("many-pods", 20, pods)
	f.write(false, pe)
	waitNumEntries(t, f, pods*len(CompilePod(pe.Pods[0].PodIP, []*endpoints.PolicyEndpoint{pe})))
	first := map[string][]byte{}
	for e := range f.entries.All(f.db.ReadTxn()) {
		id := e.Map() + " " + e.Peer().String()
		if v, ok := first[id]; !ok {
			first[id] = e.MapValue()
		} else if &v[0] != &e.MapValue()[0] {
			t.Fatalf("%s %s: value not shared with the other pods'", e.Map(), e.Peer())
		}
	}
}

// waitNumEntries waits until the table holds at least n entries.
func waitNumEntries(t testing.TB, f *deriverFixture, n int) {
	t.Helper()
	celltest.Await(t, 120*time.Second, func() (bool, <-chan struct{}, string) {
		txn := f.db.ReadTxn()
		_, watch := f.entries.AllWatch(txn)
		got := f.entries.NumObjects(txn)
		return got >= n, watch, fmt.Sprintf("%d entries, want %d", got, n)
	})
}

// heapInUse is the heap in use after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestARowKeepsItsTemplateBlockNotTheTemplate: a row left from an older
// compilation (an entry an edit did not change) keeps alive the block of
// its template entry, not the whole template: a template of a large
// PolicyEndpoint is megabytes, and each edit makes a new one.
func TestARowKeepsItsTemplateBlockNotTheTemplate(t *testing.T) {
	pe := bigObject("large", 20000, 1)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	// The heap is the process's: work another test left running may
	// allocate meanwhile, so the row fails only if it keeps the template
	// alive in each of three tries.
	var retained int64
	n := 0
	for range 3 {
		before := heap()
		rows := CompilePod(pe.Pods[0].PodIP, []*endpoints.PolicyEndpoint{pe})
		n = len(rows)
		kept := rows[n/2].Clone() // as the table keeps a Done row
		rows = nil
		retained = int64(heap()) - int64(before)
		runtime.KeepAlive(kept)
		if retained <= 256<<10 {
			break
		}
	}
	if retained > 256<<10 {
		t.Errorf("one row of %d keeps %d KB alive", n, retained>>10)
	}
	runtime.KeepAlive(pe)
}
