package manifests

import (
	"context"
	"sort"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/enimasq/enimasq/test/k8stest"
)

// TestServerSideDryRun passes every object of every kustomization through
// the real kube-apiserver's validation: a server-side apply with strict
// field validation (an unknown or duplicate field is an error) and
// dryRun=All, which validates, defaults and admits each object and stores
// none. The CRDs the objects need are installed first: Start installs the
// CiliumNode and PolicyEndpoint ones, crds/ holds the Prometheus
// Operator's PodMonitor and PrometheusRule (v0.93.0, unchanged). An object
// that is there before its dry run (the PolicyEndpoint CRD of
// network-policy/crds, which is Start's) must come out of it unchanged.
func TestServerSideDryRun(t *testing.T) {
	c := k8stest.Start(t)
	c.InstallCRDs(t, "crds")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	rendered := renderAll(t)
	dirs := make([]string, 0, len(rendered))
	for dir := range rendered {
		dirs = append(dirs, dir)
	}
	sort.Strings(dirs)
	for _, dir := range dirs {
		for _, obj := range rendered[dir] {
			what := dir + ": " + obj.GetKind() + " " + obj.GetNamespace() + "/" + obj.GetName()
			before, err := c.Get(ctx, obj)
			if err != nil && !apierrors.IsNotFound(err) {
				t.Fatalf("%s: %s", what, err)
			}
			res, err := c.Apply(ctx, obj, k8stest.DryRun())
			if err != nil {
				t.Errorf("%s: server-side dry run: %s", what, err)
				continue
			}
			if res.GetUID() == "" || res.GetNamespace() != obj.GetNamespace() {
				t.Errorf("%s: the dry run answered %s/%s uid %q", what, res.GetNamespace(), res.GetName(), res.GetUID())
			}
			after, err := c.Get(ctx, obj)
			switch {
			case before == nil && !apierrors.IsNotFound(err):
				t.Errorf("%s: the dry run stored it: %v", what, err)
			case before != nil && (err != nil || after.GetResourceVersion() != before.GetResourceVersion()):
				t.Errorf("%s: the dry run changed it (resourceVersion %s, now %v %v)", what, before.GetResourceVersion(), after, err)
			}
		}
		t.Logf("%s: %d objects pass the API server's validation", dir, len(rendered[dir]))
	}
}
