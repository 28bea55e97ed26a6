package k8sclient_test

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/enimasq/enimasq/cells/k8sclient"
)

// An embedded client lists through the embedding agent's lister-watcher for
// the resources it takes (the CiliumNode, through Cilium's typed clientset)
// and through the dynamic client for the others; without one it is
// disabled.
func TestEmbeddedClient(t *testing.T) {
	pe := &unstructured.Unstructured{}
	pe.SetGroupVersionKind(schema.GroupVersionKind{Group: "networking.k8s.aws", Version: "v1alpha1", Kind: "PolicyEndpoint"})
	pe.SetNamespace("default")
	pe.SetName("web")
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{k8sclient.PolicyEndpoints: "PolicyEndpointList"}, pe)

	override := &cache.ListWatch{}
	c, err := k8sclient.NewEmbedded("node-1", "test", "https://api", dyn,
		func(gvr schema.GroupVersionResource, _ string, _ func(*metav1.ListOptions)) cache.ListerWatcher {
			if gvr == k8sclient.CiliumNodes {
				return override
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if !c.IsEnabled() || c.Host() != "https://api" || c.NodeName() != "node-1" {
		t.Errorf("enabled %t host %q node %q", c.IsEnabled(), c.Host(), c.NodeName())
	}
	if lw := c.ListerWatcher(k8sclient.CiliumNodes, "", nil); lw != override {
		t.Errorf("CiliumNodes not listed through the embedding agent's lister-watcher")
	}
	list, err := cache.ToListerWatcherWithContext(c.ListerWatcher(k8sclient.PolicyEndpoints, "", nil)).
		ListWithContext(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if items := list.(*unstructured.UnstructuredList).Items; len(items) != 1 || items[0].GetName() != "web" {
		t.Errorf("PolicyEndpoints through the dynamic client: %v", items)
	}

	off, err := k8sclient.NewEmbedded("node-1", "", "", nil, nil)
	if err != nil || off.IsEnabled() {
		t.Errorf("without a lister-watcher: enabled %t, %v", off.IsEnabled(), err)
	}
	if _, err := k8sclient.NewEmbedded("Not_A_Node", "", "", nil, nil); err == nil {
		t.Errorf("an invalid node name is accepted")
	}
}
