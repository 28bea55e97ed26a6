package ciliumlink

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	k8sClient "github.com/cilium/cilium/pkg/k8s/client"
	nodeTypes "github.com/cilium/cilium/pkg/node/types"

	"github.com/enimasq/enimasq/cells/k8sclient"
)

// newK8sClient gives enimasq's API sources Cilium's connection: the
// CiliumNode through Cilium's typed clientset (so a CiliumNode that Cilium,
// or a test through Cilium's fake clientset, writes is what enimasq reads),
// other resources (PolicyEndpoints) through a dynamic client on Cilium's
// REST config. The node is Cilium's (K8S_NODE_NAME). With Kubernetes
// disabled in Cilium, the sources read their files.
func newK8sClient(cs k8sClient.Clientset) (*k8sclient.Client, error) {
	node := nodeTypes.GetName()
	if cs == nil || !cs.IsEnabled() {
		return k8sclient.NewEmbedded(node, "", "", nil, nil)
	}
	rc := cs.RestConfig()
	if rc == nil {
		return nil, fmt.Errorf("Cilium's clientset has no REST config")
	}
	// A dynamic client contacts nothing until it is used.
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("dynamic client on Cilium's REST config: %w", err)
	}
	lw := func(gvr schema.GroupVersionResource, _ string, tweak func(*metav1.ListOptions)) cache.ListerWatcher {
		if gvr != k8sclient.CiliumNodes {
			return nil // the dynamic client's
		}
		nodes := cs.CiliumV2().CiliumNodes()
		return unstructuredListWatch(gvr.GroupVersion().WithKind("CiliumNode"), tweak,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return nodes.List(ctx, o) },
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return nodes.Watch(ctx, o) })
	}
	return k8sclient.NewEmbedded(node, "Cilium's clientset", rc.Host, dyn, lw)
}

// unstructuredListWatch lists and watches through a typed client and hands
// out *unstructured.Unstructured objects of kind gvk, as the dynamic client
// would. The list keeps its resourceVersion but not metadata.continue: the
// CiliumNode is listed by name, one object, never paged.
func unstructuredListWatch(gvk schema.GroupVersionKind, tweak func(*metav1.ListOptions),
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
) cache.ListerWatcher {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			if tweak != nil {
				tweak(&o)
			}
			typed, err := list(ctx, o)
			if err != nil {
				return nil, err
			}
			items, err := meta.ExtractList(typed)
			if err != nil {
				return nil, err
			}
			out := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": gvk.GroupVersion().String(), "kind": gvk.Kind + "List"}}
			if lm, err := meta.ListAccessor(typed); err == nil {
				out.SetResourceVersion(lm.GetResourceVersion())
			}
			for _, item := range items {
				u, err := toUnstructured(gvk, item)
				if err != nil {
					return nil, err
				}
				out.Items = append(out.Items, *u)
			}
			return out, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if tweak != nil {
				tweak(&o)
			}
			w, err := watchFn(ctx, o)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
				if e.Type == watch.Error || e.Object == nil {
					return e, true
				}
				u, err := toUnstructured(gvk, e.Object)
				if err != nil {
					return watch.Event{Type: watch.Error, Object: &metav1.Status{Status: metav1.StatusFailure, Message: err.Error()}}, true
				}
				e.Object = u
				return e, true
			}), nil
		},
	}
}

// toUnstructured goes through JSON, so that enimasq's parser sees the
// object exactly as the API server serves it (omitempty included: the first
// ENI has no number).
func toUnstructured(gvk schema.GroupVersionKind, obj runtime.Object) (*unstructured.Unstructured, error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("%s to JSON: %w", gvk.Kind, err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s from JSON: %w", gvk.Kind, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(gvk)
	return u, nil
}
