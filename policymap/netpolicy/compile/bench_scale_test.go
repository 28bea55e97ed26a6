package compile

import (
	"fmt"
	"net/netip"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// bigObject is one PolicyEndpoint with many egress rules and pods, shaped
// like the controller's output for a large policy: a /24 per rule, every
// fourth with an except, one or two ports each, under a 10.0.0.0/8 rule and
// a 0.0.0.0/0 rule that excepts it; two ingress rules. Pod i is
// 100.64.0.0 + i, on node 100.127.0.1.
func bigObject(name string, rules, pods int) *endpoints.PolicyEndpoint {
	pe := &endpoints.PolicyEndpoint{
		Namespace: "bench", Name: name, PolicyRef: "bench/" + name,
		IsolatesIngress: true, IsolatesEgress: true,
	}
	host := netip.MustParseAddr("100.127.0.1")
	for i := range pods {
		pe.Pods = append(pe.Pods, endpoints.PodEndpoint{Name: fmt.Sprintf("pod-%d", i), Namespace: "bench",
			PodIP: netip.AddrFrom4([4]byte{100, 64 + byte(i>>16), byte(i >> 8), byte(i)}), HostIP: host})
	}
	pe.Egress = append(pe.Egress,
		endpoints.Rule{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Except: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			Ports: []endpoints.Port{{Protocol: policybpf.ProtocolTCP, Port: 443}}},
		endpoints.Rule{CIDR: netip.MustParsePrefix("10.0.0.0/8"), Ports: []endpoints.Port{{Protocol: policybpf.ProtocolUDP, Port: 53}}})
	for i := range rules - 2 {
		base := [4]byte{10 + byte(i>>16), byte(i >> 8), byte(i), 0} // 10.x.y.0/24, then 11.x.y.0/24
		r := endpoints.Rule{CIDR: netip.PrefixFrom(netip.AddrFrom4(base), 24),
			Ports: []endpoints.Port{{Protocol: policybpf.ProtocolTCP, Port: uint16(1000 + i%50)}}}
		if i%4 == 0 {
			ex := base
			ex[3] = 128
			r.Except = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4(ex), 25)}
		}
		if i%10 == 0 {
			r.Ports = append(r.Ports, endpoints.Port{Protocol: policybpf.ProtocolTCP, Port: 8000, EndPort: 8100})
		}
		pe.Egress = append(pe.Egress, r)
	}
	pe.Ingress = []endpoints.Rule{
		{CIDR: netip.MustParsePrefix("172.16.0.0/12"), Except: []netip.Prefix{netip.MustParsePrefix("172.16.1.0/24")},
			Ports: []endpoints.Port{{Protocol: policybpf.ProtocolTCP, Port: 8080}}},
		{CIDR: netip.MustParsePrefix("100.64.0.0/10")},
	}
	return pe
}

// BenchmarkPolicyCompileScaling compiles one pod of a PolicyEndpoint with
// 5,000 and with 50,000 egress rules in the same run: ms-5k and ms-50k are
// the times of one compile (template and stamp), ratio their quotient (10
// for linear scaling); each the median over the iterations, so that one
// disturbed iteration does not decide. Each iteration compiles the small
// object ten times and the large one once: the same work and allocation on
// both sides, so that the collector's share (a cycle per ~16 MB allocated
// here) is counted alike; one compile of the large object before the runs
// grows the heap to its size. ratio-cold is the median quotient of single
// compiles each right after a collection, where the small one runs inside
// the minimum heap and never meets the collector.
func BenchmarkPolicyCompileScaling(b *testing.B) {
	small, large := bigObject("small", 5000, 1), bigObject("large", 50000, 1)
	pod := small.Pods[0].PodIP
	compile := func(pe *endpoints.PolicyEndpoint, times int) (time.Duration, int) {
		n := 0
		start := time.Now()
		for range times {
			n = len(CompilePod(pod, []*endpoints.PolicyEndpoint{pe}))
		}
		return time.Since(start) / time.Duration(times), n
	}
	compile(large, 1)
	var small1, large1, ratio, cold []float64
	var n5, n50 int
	for b.Loop() {
		ds, n := compile(small, 10)
		n5 = n
		dl, n := compile(large, 1)
		n50 = n
		small1, large1 = append(small1, ds.Seconds()*1e3), append(large1, dl.Seconds()*1e3)
		ratio = append(ratio, float64(dl)/float64(ds))
		b.StopTimer()
		runtime.GC()
		ds, _ = compile(small, 1)
		runtime.GC()
		dl, _ = compile(large, 1)
		cold = append(cold, float64(dl)/float64(ds))
		b.StartTimer()
	}
	b.ReportMetric(median(small1), "ms-5k")
	b.ReportMetric(median(large1), "ms-50k")
	b.ReportMetric(median(ratio), "ratio")
	b.ReportMetric(median(cold), "ratio-cold")
	b.ReportMetric(float64(n5), "entries-5k")
	b.ReportMetric(float64(n50), "entries-50k")
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// manyPodsObject is the shape of the 3.8 MB file: 50,000 pods
// (about 76 bytes of YAML each) and a rule per direction.
func manyPodsObject(pods int) *endpoints.PolicyEndpoint {
	pe := bigObject("many-pods", 2, pods)
	pe.Egress = pe.Egress[1:] // 10.0.0.0/8 udp/53
	pe.Ingress = pe.Ingress[1:]
	return pe
}

// BenchmarkPolicyManyPodsMemory writes one PolicyEndpoint with 50,000 pods
// and a rule per direction (manyPodsObject) into a running deriver (no
// maps: the benchmark marks the entries Done, as the reconciler would) and
// measures the memory its table rows hold: heap-MB is the heap in use
// after a collection, less that before; rss-MB the growth of the
// process's resident set once the deriver has returned freed memory,
// rss-peak-MB its highest on the way; B/entry the heap per
// policy-map-entries row. All are the first run's (later runs start with
// its pages, and its tables live until the benchmark ends). The
// process figures, with the reconciler and kernel maps, are
// test.BenchmarkProcessPolicyManyPods50000's.
func BenchmarkPolicyManyPodsMemory(b *testing.B) {
	const pods = 50000
	pe := manyPodsObject(pods)
	perPod := len(CompilePod(pe.Pods[0].PodIP, []*endpoints.PolicyEndpoint{pe}))
	var heap, rss, peak float64
	for b.Loop() {
		b.StopTimer()
		before, rssBefore := heapInUse(), celltest.ProcMemory(b, 0, "VmRSS")
		celltest.ResetPeakRSS(b, 0)
		b.StartTimer()
		returned := make(chan [2]int, 1)
		f := startDeriver(b, nodeconfig.Config{EnableIPv4: true}, returnsMemory(defaultReturnMemoryAfter, returned),
			func(d *policyDeriver) {
				report := d.returnMemory
				d.returnMemory = func() { debug.FreeOSMemory(); report() }
			})
		f.write(false, pe)
		waitNumEntries(b, f, pods*perPod)
		f.waitSettled(b)
		f.markDone()
		<-returned
		b.StopTimer()
		if rss == 0 { // the first run's: later ones start with its pages
			heap = float64(int64(heapInUse()) - int64(before))
			rss = float64(int64(celltest.ProcMemory(b, 0, "VmRSS")) - int64(rssBefore))
			peak = float64(int64(celltest.ProcMemory(b, 0, "VmHWM")) - int64(rssBefore))
		}
		f.stop()
		b.StartTimer()
	}
	b.ReportMetric(heap/(1<<20), "heap-MB")
	b.ReportMetric(rss/(1<<20), "rss-MB")
	b.ReportMetric(peak/(1<<20), "rss-peak-MB")
	b.ReportMetric(heap/float64(pods*perPod), "B/entry")
	b.ReportMetric(float64(perPod), "entries/pod")
}

// BenchmarkPolicySmallDuringLargeCompile: with the maps and the
// reconciler running, a 50,000-rule PolicyEndpoint is written, then a
// one-rule one. small-ms is the time from the small one's write until its
// entries are Done (in the kernel); large-ms the time from the large one's
// write until all its entries are. The small one must not wait for the
// large one.
func BenchmarkPolicySmallDuringLargeCompile(b *testing.B) {
	celltest.RequireRoot(b)
	h := startPolicyHarness(b, harnessOptions{})
	large, small := bigObject("large", 50000, 1), smallObject()
	smallWant := CompilePod(small.Pods[0].PodIP, []*endpoints.PolicyEndpoint{small})
	n := len(CompilePod(large.Pods[0].PodIP, []*endpoints.PolicyEndpoint{large})) + len(smallWant)
	var ts, tl time.Duration
	for b.Loop() {
		runtime.GC()
		start := time.Now()
		h.setEndpoints([]*endpoints.PolicyEndpoint{large})
		smallStart := time.Now()
		wtxn := h.db.WriteTxn(h.endpoints)
		h.endpoints.Insert(wtxn, small)
		wtxn.Commit()
		h.waitPod(small.Pods[0].PodIP, smallWant)
		ts += time.Since(smallStart)
		h.waitAllDone(n)
		tl += time.Since(start)
		b.StopTimer()
		h.setEndpoints(nil)
		h.waitAllDone(0)
		b.StartTimer()
	}
	b.ReportMetric(float64(ts.Microseconds())/1e3/float64(b.N), "small-ms")
	b.ReportMetric(float64(tl.Microseconds())/1e3/float64(b.N), "large-ms")
}

// waitSettled waits until the deriver reports its work written.
func (f *deriverFixture) waitSettled(tb testing.TB) {
	tb.Helper()
	celltest.Await(tb, 60*time.Second, func() (bool, <-chan struct{}, string) {
		last, changed := f.health.Watch()
		return strings.Contains(last, "entries written"), changed, fmt.Sprintf("the deriver did not settle: %q", last)
	})
}
