package k8sclient

import (
	"cmp"
	"context"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// Snapshot is what an API-backed source sees of a watched resource.
type Snapshot struct {
	// Objects are the objects in the informer's cache, sorted by namespace
	// and name. While Err is set they are the last ones seen.
	Objects []*unstructured.Unstructured
	// Synced is true once the informer has listed the resource at least
	// once: only then is an absent object really absent.
	Synced bool
	// Err is the last list or watch error, nil once a list or watch has
	// succeeded again. The informer retries with its own backoff.
	Err error
}

// listWatch is a list and a watch without client-go's watch-list: its
// reflector waits out a watch-list retry's backoff (up to 30 s) without
// looking at the context, so that an informer would not stop while the API
// server is away. A list then a watch stops at once.
type listWatch struct{ *cache.ListWatch }

func (listWatch) IsWatchListSemanticsUnSupported() bool { return true }

// Watch runs an informer on resource gvr in namespace ("" for all
// namespaces or a cluster-scoped resource; tweak as for ListerWatcher) until
// ctx ends, and calls update from a single goroutine: after every change,
// list or watch error and recovery, once the informer has synced, or, before
// that, only with an error (Synced false). Bursts of changes are coalesced:
// update always sees the latest state. It panics when the client is
// disabled.
func (c *Client) Watch(ctx context.Context, gvr schema.GroupVersionResource, namespace string, tweak func(*metav1.ListOptions), update func(Snapshot)) {
	inner := cache.ToListerWatcherWithContext(c.ListerWatcher(gvr, namespace, tweak))

	var (
		mu      sync.Mutex
		lastErr error
	)
	trigger := make(chan struct{}, 1)
	kick := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	setErr := func(err error) {
		err = stable(err)
		mu.Lock()
		changed := (lastErr == nil) != (err == nil) || (err != nil && lastErr.Error() != err.Error())
		lastErr = err
		mu.Unlock()
		if changed {
			kick()
		}
	}
	// Every list and watch call sets or clears the error: the reflector
	// retries a refused watch without calling the watch error handler, and
	// a list that succeeds after an outage gives no event when nothing
	// changed.
	lw := listWatch{&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			obj, err := inner.ListWithContext(ctx, opts)
			setErr(err)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			w, err := inner.WatchWithContext(ctx, opts)
			setErr(err)
			return w, err
		},
	}}
	inf := cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, cache.Indexers{})
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		setErr(err)
	})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick() },
		UpdateFunc: func(any, any) { kick() },
		DeleteFunc: func(any) { kick() },
	})

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(2)
	go func() {
		defer wg.Done()
		inf.RunWithContext(ctx)
	}()
	go func() {
		defer wg.Done()
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			kick()
		}
	}()

	for {
		select {
		case <-ctx.Done():
			return
		case <-trigger:
		}
		mu.Lock()
		err := lastErr
		mu.Unlock()
		snap := Snapshot{Synced: inf.HasSynced(), Err: err}
		if !snap.Synced && err == nil {
			continue
		}
		for _, o := range inf.GetStore().List() {
			if u, ok := o.(*unstructured.Unstructured); ok {
				snap.Objects = append(snap.Objects, u)
			}
		}
		slices.SortFunc(snap.Objects, func(a, b *unstructured.Unstructured) int {
			return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
		})
		update(snap)
	}
}
