package compile

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// The peer churn of test's BenchmarkProcessPolicyPeerChurn, in process: 10
// policies of 10 pods, each allowing ingress on TCP 8080 from 2,000 peers,
// in the controller's slices of 200 (the pods on the first); a change
// replaces one peer of one slice.
const churnPolicies, churnPods, churnPeers, churnChunk = 10, 10, 2000, 200

func churnSlices() [][]*endpoints.PolicyEndpoint {
	out := make([][]*endpoints.PolicyEndpoint, churnPolicies)
	for p := range churnPolicies {
		for s := range churnPeers / churnChunk {
			pe := &endpoints.PolicyEndpoint{Namespace: "bench", Name: fmt.Sprintf("np-%d-%d", p, s), PolicyRef: fmt.Sprintf("bench/np-%d", p),
				IsolatesIngress: true}
			if s == 0 {
				for i := range churnPods {
					pe.Pods = append(pe.Pods, endpoints.PodEndpoint{Name: fmt.Sprintf("pod-%d-%d", p, i), Namespace: "bench",
						PodIP: netip.AddrFrom4([4]byte{10, 1, byte(p), byte(1 + i)}), HostIP: netip.MustParseAddr("10.130.0.10")})
				}
			}
			for i := range churnChunk {
				n := s*churnChunk + i
				pe.Ingress = append(pe.Ingress, endpoints.Rule{CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + p), byte(n >> 8), byte(n)}), 32),
					Ports: []endpoints.Port{{Protocol: policybpf.ProtocolTCP, Port: 8080}}})
			}
			out[p] = append(out[p], pe)
		}
	}
	return out
}

// BenchmarkPolicyPeerChurn: with the 10 policies programmed (200,300 rows,
// real maps), one change replaces a peer of one slice; timed from its
// write into policy-endpoints until every selected pod's rows are exactly
// its new compilation, Done. map-ops is the element operations the maps
// saw for it, against the floor (2 per selected pod: one key out, one in);
// ms/change the time, with the compile, the rows' diff and the reconciler
// in it.
func BenchmarkPolicyPeerChurn(b *testing.B) {
	pols := churnSlices()
	var all []*endpoints.PolicyEndpoint
	for _, p := range pols {
		all = append(all, p...)
	}
	h := startPolicyHarness(b, harnessOptions{maxEntries: 1 << 19})
	h.setEndpoints(all)
	h.waitAllDone(churnPolicies * churnPods * (churnPeers + 3))
	ops := h.countOps()

	next := churnPeers
	var synced time.Duration
	var changes int64
	runtime.GC()
	b.ResetTimer()
	for i := range b.N {
		p := i % churnPolicies
		sl := pols[p][(i/churnPolicies)%len(pols[p])]
		changed := *sl
		changed.Ingress = slices.Clone(sl.Ingress)
		j := (i * 37) % len(changed.Ingress)
		changed.Ingress = append(slices.Delete(changed.Ingress, j, j+1), endpoints.Rule{
			CIDR:  netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + p), byte(next >> 8), byte(next)}), 32),
			Ports: []endpoints.Port{{Protocol: policybpf.ProtocolTCP, Port: 8080}}})
		next++
		gone, came := sl.Ingress[j].CIDR, changed.Ingress[len(changed.Ingress)-1].CIDR
		for k, s := range pols[p] {
			if s == sl {
				pols[p][k] = &changed
			}
		}
		start := time.Now()
		wtxn := h.db.WriteTxn(h.endpoints)
		h.endpoints.Insert(wtxn, &changed)
		wtxn.Commit()
		for k := range churnPods {
			h.waitPeer(pols[p][0].Pods[k].PodIP, gone, came)
		}
		synced += time.Since(start)
		changes++
	}
	b.StopTimer()
	for p := range churnPolicies { // the rows are the final compilation, exactly
		for k := range churnPods {
			pod := pols[p][0].Pods[k].PodIP
			h.waitPod(pod, CompilePod(pod, pols[p]))
		}
	}
	// The deletions are in the kernel after the rows leave the table.
	want := 2 * churnPods * changes
	for deadline := time.Now().Add(5 * time.Second); ops() < want && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
	}
	b.ReportMetric(float64(ops())/float64(changes), "map-ops")
	b.ReportMetric(float64(ops())/float64(want), "x-floor")
	b.ReportMetric(float64(synced.Microseconds())/1e3/float64(changes), "ms/change")
}

// waitPeer waits until a pod's ingress rows hold peer came, Done, and no
// longer gone.
func (h *policyHarness) waitPeer(pod netip.Addr, gone, came netip.Prefix) {
	h.tb.Helper()
	rows := func(peer netip.Prefix) statedb.Query[*PolicyMapEntry] {
		id := mapEntryID(policybpf.PolicyMapNames, policybpf.PolicyIngressV4MapName, pod, peer, 0)
		return statedb.Index[*PolicyMapEntry, PolicyEntryKey]{Name: entryIndexName}.QueryFromKey(id[:len(id)-4])
	}
	celltest.Await(h.tb, 30*time.Second, func() (bool, <-chan struct{}, string) {
		txn := h.db.ReadTxn()
		iter, watch := h.entries.PrefixWatch(txn, rows(came))
		ok := false
		for e := range iter {
			ok = e.Status.Kind == reconciler.StatusKindDone
		}
		for range h.entries.Prefix(txn, rows(gone)) {
			ok = false
		}
		return ok, watch, fmt.Sprintf("pod %s: %s not in, or %s not out", pod, came, gone)
	})
}
