package compile

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// slicesOf cuts pe as the AWS network policy controller does at chunk size
// n (--endpoint-chunk-size): its pods in slices of n, its rules in slices
// of n apart from them (a slice holds pods or rules), all of one policy.
func slicesOf(pe *endpoints.PolicyEndpoint, n int) []*endpoints.PolicyEndpoint {
	var out []*endpoints.PolicyEndpoint
	slice := func() *endpoints.PolicyEndpoint {
		s := &endpoints.PolicyEndpoint{Namespace: pe.Namespace, Name: fmt.Sprintf("%s-%d", pe.Name, len(out)), PolicyRef: pe.PolicyRef,
			IsolatesIngress: pe.IsolatesIngress, IsolatesEgress: pe.IsolatesEgress}
		out = append(out, s)
		return s
	}
	for i := 0; i < len(pe.Pods); i += n {
		slice().Pods = pe.Pods[i:min(i+n, len(pe.Pods))]
	}
	for i := 0; i < len(pe.Egress); i += n {
		slice().Egress = pe.Egress[i:min(i+n, len(pe.Egress))]
	}
	for i := 0; i < len(pe.Ingress); i += n {
		slice().Ingress = pe.Ingress[i:min(i+n, len(pe.Ingress))]
	}
	return out
}

// BenchmarkPolicySlicedManyPods derives one policy of 50,000 pods (a rule
// per direction, manyPodsObject) written whole, the floor, and cut into the
// 252 slices of 200 the controller writes, in the same run: ms-whole and
// ms-sliced are the times from the write until every entry is in the
// table (a deriver without maps), ratio their quotient. A pod of a sliced
// policy is compiled from the union of all its slices (endpoints.Union):
// the union is taken once per transaction and set of policies, not per
// pod, so the ratio stays near 1. ms-pod-added is the time from a write of
// one slice with one more pod (a pod scheduled: the common change) until
// that pod's entries are in the table: only the pods that come or go are
// recompiled, not the policy's 50,000.
func BenchmarkPolicySlicedManyPods(b *testing.B) {
	const pods = 50000
	whole := manyPodsObject(pods)
	sliced := slicesOf(whole, 200)
	perPod := len(CompilePod(whole.Pods[0].PodIP, []*endpoints.PolicyEndpoint{whole}))
	if got := len(CompilePod(whole.Pods[0].PodIP, sliced)); got != perPod {
		b.Fatalf("a pod of the sliced policy has %d entries, of the whole one %d", got, perPod)
	}
	// grown is the first slice with one more pod.
	grown := *sliced[0]
	grown.Pods = append(slices.Clone(grown.Pods), manyPodsObject(pods + 1).Pods[pods])
	derive := func(pes []*endpoints.PolicyEndpoint) (all, added time.Duration) {
		f := startDeriver(b, nodeconfig.Config{EnableIPv4: true})
		defer f.stop()
		start := time.Now()
		f.write(false, pes...)
		waitNumEntries(b, f, pods*perPod)
		all = time.Since(start)
		if len(pes) > 1 {
			start = time.Now()
			f.write(false, &grown)
			waitNumEntries(b, f, (pods+1)*perPod)
			added = time.Since(start)
		}
		return all, added
	}
	var wholeMS, slicedMS, ratio, addedMS []float64
	for b.Loop() {
		w, _ := derive([]*endpoints.PolicyEndpoint{whole})
		s, added := derive(sliced)
		wholeMS, slicedMS = append(wholeMS, w.Seconds()*1e3), append(slicedMS, s.Seconds()*1e3)
		ratio = append(ratio, float64(s)/float64(w))
		addedMS = append(addedMS, added.Seconds()*1e3)
	}
	b.ReportMetric(median(wholeMS), "ms-whole")
	b.ReportMetric(median(slicedMS), "ms-sliced")
	b.ReportMetric(median(ratio), "ratio")
	b.ReportMetric(median(addedMS), "ms-pod-added")
	b.ReportMetric(float64(len(sliced)), "slices")
}
