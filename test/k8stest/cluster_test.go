package k8stest_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/test/k8stest"
)

var samples = filepath.Join(k8stest.SourceDir(), "..", "testdata", "samples")

func TestDecode(t *testing.T) {
	objs, err := k8stest.Decode(strings.NewReader(`
# a comment
---
apiVersion: v1
kind: ConfigMap
metadata: {name: a}
---
---
{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}},
  {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.GetName())
	}
	if strings.Join(names, ",") != "a,b,c" {
		t.Fatalf("decoded %v", names)
	}
	if _, err := k8stest.Decode(strings.NewReader("metadata: {name: x}\n")); err == nil {
		t.Fatal("an object without kind decoded")
	}
}

// TestSamples: the samples apply to the test CRDs as they are (spec and
// status), come back unchanged (nothing pruned), are readable with the
// kubeconfig file, and survive an API server restart.
func TestSamples(t *testing.T) {
	c := k8stest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var applied []*unstructured.Unstructured
	for _, f := range []string{"ciliumnode.yaml", "policyendpoint-v6-except.yaml"} {
		objs := k8stest.DecodeFile(t, filepath.Join(samples, f))
		c.MustApply(t, objs...)
		for _, want := range objs {
			got, err := c.Get(ctx, want)
			if err != nil {
				t.Fatal(err)
			}
			for _, field := range []string{"spec", "status"} {
				if w, g := jsonOf(t, want.Object[field]), jsonOf(t, got.Object[field]); w != g {
					t.Errorf("%s %s: %s changed by the API server:\nsent %s\ngot  %s", f, want.GetName(), field, w, g)
				}
			}
		}
		applied = append(applied, objs...)
	}

	// The kubeconfig file is what a test hands to the agent.
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	list := func() ([]string, error) {
		var names []string
		cns, err := dyn.Resource(k8sclient.CiliumNodes).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		peps, err := dyn.Resource(k8sclient.PolicyEndpoints).Namespace("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for _, o := range append(cns.Items, peps.Items...) {
			names = append(names, o.GetName())
		}
		return names, nil
	}
	before, err := list()
	if err != nil || len(before) != 2 {
		t.Fatalf("with the kubeconfig: %v %v", before, err)
	}

	c.StopAPIServer(t)
	if _, err := list(); err == nil {
		t.Fatal("the API server answers after StopAPIServer")
	}
	c.StartAPIServer(t)
	after, err := list()
	if err != nil || strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("after a restart: %v %v, want %v", after, err, before)
	}

	for _, obj := range applied {
		if err := c.Delete(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	if after, err = list(); err != nil || len(after) != 0 {
		t.Fatalf("after delete: %v %v", after, err)
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
