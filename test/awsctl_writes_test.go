package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/policymap/netpolicy/source"
	"github.com/enimasq/enimasq/test/k8stest"
)

// awsWrites follows the controller's objects (PolicyEndpoints and
// ClusterPolicyEndpoints) on the API server: how many writes were seen and
// when the last one was.
type awsWrites struct {
	mu    sync.Mutex
	count int
	last  time.Time
	pes   cache.Store
	cpes  cache.Store
}

func watchAWSWrites(t *testing.T, c *k8stest.Cluster) *awsWrites {
	t.Helper()
	w := &awsWrites{}
	f := dynamicinformer.NewDynamicSharedInformerFactory(c.Dynamic(), 0)
	note := func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.count++
		w.last = time.Now()
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { note() },
		UpdateFunc: func(any, any) { note() },
		DeleteFunc: func(any) { note() },
	}
	for _, gvr := range []schema.GroupVersionResource{k8sclient.PolicyEndpoints, source.ClusterPolicyEndpoints} {
		inf := f.ForResource(gvr).Informer()
		if _, err := inf.AddEventHandler(handler); err != nil {
			t.Fatal(err)
		}
		if gvr == k8sclient.PolicyEndpoints {
			w.pes = inf.GetStore()
		} else {
			w.cpes = inf.GetStore()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); f.Shutdown() })
	f.Start(ctx.Done())
	for gvr, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("watching %s: no sync", gvr.Resource)
		}
	}
	return w
}

func (w *awsWrites) snapshot() (int, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.count, w.last
}

// controllerIdle says whether the controller has nothing queued and no
// reconcile running (controller-runtime's workqueue_depth and
// controller_runtime_active_workers, all zero).
func (e *awsEnv) controllerIdle() (bool, error) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(e.metrics)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, err
	}
	seen := 0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "workqueue_depth{") && !strings.HasPrefix(line, "controller_runtime_active_workers{") {
			continue
		}
		seen++
		fields := strings.Fields(line)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err != nil || v != 0 {
			return false, err
		}
	}
	if seen == 0 {
		return false, fmt.Errorf("no workqueue_depth or controller_runtime_active_workers in %s", e.metrics)
	}
	return true, nil
}

// slices counts the controller's objects per parent policy: slices of
// each NetworkPolicy or ApplicationNetworkPolicy (namespace/name) and of
// each ClusterNetworkPolicy, and the slices that hold rules and no pod.
func (e *awsEnv) slices() (pe, cpe map[string]int, rulesNoPods int) {
	pe, cpe = map[string]int{}, map[string]int{}
	count := func(store cache.Store, into map[string]int, key func(*unstructured.Unstructured) string) {
		for _, o := range store.List() {
			u := o.(*unstructured.Unstructured)
			into[key(u)]++
			pods, _, _ := unstructured.NestedSlice(u.Object, "spec", "podSelectorEndpoints")
			in, _, _ := unstructured.NestedSlice(u.Object, "spec", "ingress")
			out, _, _ := unstructured.NestedSlice(u.Object, "spec", "egress")
			if len(pods) == 0 && len(in)+len(out) > 0 {
				rulesNoPods++
			}
		}
	}
	count(e.writes.pes, pe, func(u *unstructured.Unstructured) string {
		ns, _, _ := unstructured.NestedString(u.Object, "spec", "policyRef", "namespace")
		name, _, _ := unstructured.NestedString(u.Object, "spec", "policyRef", "name")
		return ns + "/" + name
	})
	count(e.writes.cpes, cpe, func(u *unstructured.Unstructured) string {
		name, _, _ := unstructured.NestedString(u.Object, "spec", "policyRef", "name")
		return name
	})
	return pe, cpe, rulesNoPods
}

// checkSliced logs how the controller cut the policies and, at a chunk
// size of 2, fails unless a NetworkPolicy and a ClusterNetworkPolicy are
// each in several slices and some slice holds rules and no pod (what makes
// the chunk size matter).
func (e *awsEnv) checkSliced(what string, chunkSize int) {
	t := e.t
	t.Helper()
	pe, cpe, rulesNoPods := e.slices()
	most := func(m map[string]int) (string, int) {
		best, n := "", 0
		for _, k := range awsSortedKeys(m) {
			if m[k] > n {
				best, n = k, m[k]
			}
		}
		return best, n
	}
	total := func(m map[string]int) int {
		n := 0
		for _, v := range m {
			n += v
		}
		return n
	}
	peMost, peN := most(pe)
	cpeMost, cpeN := most(cpe)
	t.Logf("%s: chunk size %d: %d PolicyEndpoints of %d policies (most: %s in %d), %d ClusterPolicyEndpoints of %d (most: %s in %d), %d slices with rules and no pod",
		what, chunkSize, total(pe), len(pe), peMost, peN, total(cpe), len(cpe), cpeMost, cpeN, rulesNoPods)
	if chunkSize <= 2 && (peN < 2 || cpeN < 2 || rulesNoPods == 0) {
		t.Errorf("%s: at chunk size %d the controller should cut policies into slices (a PolicyEndpoint parent in %d, a ClusterPolicyEndpoint parent in %d, %d slices with rules and no pod)",
			what, chunkSize, peN, cpeN, rulesNoPods)
	}
}

// reslice stops the controller, deletes every object it wrote (the agent
// sees them go), and starts it again at chunkSize: it writes every object
// again, cut in slices of the new size. It returns the write count before
// the restart.
func (e *awsEnv) reslice(chunkSize int) int {
	t := e.t
	t.Helper()
	e.ctl.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, store := range []cache.Store{e.writes.pes, e.writes.cpes} {
		for _, o := range store.List() {
			u := o.(*unstructured.Unstructured)
			ri, _, err := e.cluster.ResourceFor(u)
			if err == nil {
				err = ri.Delete(ctx, u.GetName(), awsDeleteNow)
			}
			if err != nil && !apierrors.IsNotFound(err) {
				t.Fatalf("delete the controller's %s %s/%s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
			}
		}
	}
	// Wait until the watch has seen them go, so that the writes counted
	// from here are the restarted controller's.
	deadline := time.Now().Add(time.Minute)
	for len(e.writes.pes.List())+len(e.writes.cpes.List()) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the deleted PolicyEndpoints and ClusterPolicyEndpoints are still watched")
		}
		time.Sleep(20 * time.Millisecond)
	}
	before, _ := e.writes.snapshot()
	e.ctl.Restart(t, chunkSize)
	return before
}

var awsDeleteNow = metav1.DeleteOptions{}
