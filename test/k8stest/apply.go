package k8stest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

// FieldManager is the server-side apply field manager of the test client.
const FieldManager = "enimasq-test"

var (
	serviceAccounts = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	namespaces      = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	crds            = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	createOptions   = metav1.CreateOptions{FieldManager: FieldManager}
)

// Decode reads a stream of YAML or JSON documents (YAML separated by
// "---"), as kubectl does, skipping empty ones and expanding List kinds.
func Decode(r io.Reader) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.IsList() {
			err := u.EachListItem(func(o runtime.Object) error {
				out = append(out, o.(*unstructured.Unstructured))
				return nil
			})
			if err != nil {
				return nil, err
			}
			continue
		}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("document %d: no apiVersion or kind", len(out)+1)
		}
		out = append(out, u)
	}
}

// DecodeFile reads the objects of a YAML or JSON file.
func DecodeFile(t testing.TB, path string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %s", path, err)
	}
	return objs
}

// ApplyOption changes how Apply applies.
type ApplyOption func(*metav1.PatchOptions)

// DryRun applies with dryRun=All: the server validates, defaults and admits
// the object and stores nothing.
func DryRun() ApplyOption {
	return func(o *metav1.PatchOptions) { o.DryRun = []string{metav1.DryRunAll} }
}

// ResourceFor returns the client for obj's resource (in obj's namespace when
// namespaced) and its mapping.
func (c *Cluster) ResourceFor(obj *unstructured.Unstructured) (dynamic.ResourceInterface, *meta.RESTMapping, error) {
	gvk := obj.GroupVersionKind()
	mapping, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		c.mapper.Reset() // a CRD installed since the last discovery
		mapping, err = c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return nil, nil, err
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		return c.dyn.Resource(mapping.Resource).Namespace(ns), mapping, nil
	}
	return c.dyn.Resource(mapping.Resource), mapping, nil
}

// Apply applies obj with server-side apply (field manager enimasq-test,
// forced, strict field validation: an unknown or duplicate field is an
// error) and returns the object as the server has it. The read-only
// metadata of `kubectl get -o yaml` output (resourceVersion, uid,
// creationTimestamp, managedFields, generation) is dropped first. A
// namespace that does not exist is created. When obj has a status and its
// resource a status subresource, the status is applied there too, as a
// controller would write it.
func (c *Cluster) Apply(ctx context.Context, obj *unstructured.Unstructured, opts ...ApplyOption) (*unstructured.Unstructured, error) {
	obj = obj.DeepCopy()
	for _, f := range []string{"resourceVersion", "uid", "creationTimestamp", "managedFields", "generation", "selfLink"} {
		unstructured.RemoveNestedField(obj.Object, "metadata", f)
	}
	ri, mapping, err := c.ResourceFor(obj)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	po := metav1.PatchOptions{FieldManager: FieldManager, Force: ptr(true), FieldValidation: "Strict"}
	for _, o := range opts {
		o(&po)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace && obj.GetNamespace() != "" && len(po.DryRun) == 0 {
		if err := c.ensureNamespace(ctx, obj.GetNamespace()); err != nil {
			return nil, err
		}
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("%s %s", mapping.Resource.Resource, name(obj))
	res, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, po)
	if err != nil {
		return nil, fmt.Errorf("apply %s: %w", what, err)
	}
	status, ok := obj.Object["status"]
	if !ok {
		return res, nil
	}
	st := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": obj.GetAPIVersion(),
		"kind":       obj.GetKind(),
		"metadata":   map[string]any{"name": obj.GetName(), "namespace": obj.GetNamespace()},
		"status":     status,
	}}
	if st.GetNamespace() == "" {
		unstructured.RemoveNestedField(st.Object, "metadata", "namespace")
	}
	if data, err = json.Marshal(st.Object); err != nil {
		return nil, err
	}
	res2, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, po, "status")
	switch {
	case apierrors.IsNotFound(err) && len(po.DryRun) > 0:
		return res, nil // a dry-run object is not there to have a status
	case err != nil:
		return nil, fmt.Errorf("apply %s status: %w", what, err)
	}
	return res2, nil
}

// MustApply applies each object and fails the test on an error.
func (c *Cluster) MustApply(t testing.TB, objs ...*unstructured.Unstructured) []*unstructured.Unstructured {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []*unstructured.Unstructured
	for _, obj := range objs {
		res, err := c.Apply(ctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, res)
	}
	return out
}

// ApplyFile applies the objects of a YAML or JSON file.
func (c *Cluster) ApplyFile(t testing.TB, path string) []*unstructured.Unstructured {
	t.Helper()
	return c.MustApply(t, DecodeFile(t, path)...)
}

// Get returns the current version of obj (by kind, namespace and name).
func (c *Cluster) Get(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	ri, _, err := c.ResourceFor(obj)
	if err != nil {
		return nil, err
	}
	return ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
}

// Delete deletes obj (by kind, namespace and name) and waits until it is
// gone. An object that is already gone is not an error.
func (c *Cluster) Delete(ctx context.Context, obj *unstructured.Unstructured) error {
	ri, mapping, err := c.ResourceFor(obj)
	if err != nil {
		return err
	}
	err = ri.Delete(ctx, obj.GetName(), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s: %w", mapping.Resource.Resource, name(obj), err)
	}
	for {
		_, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("delete %s %s: still there: %w", mapping.Resource.Resource, name(obj), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) ensureNamespace(ctx context.Context, ns string) error {
	_, err := c.dyn.Resource(namespaces).Get(ctx, ns, metav1.GetOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return err
	}
	_, err = c.dyn.Resource(namespaces).Create(ctx, unstructuredOf(map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns},
	}), createOptions)
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// InstallCRDs applies every *.yaml file of dir and waits until each
// CustomResourceDefinition in them is established and its kind is served.
func (c *Cluster) InstallCRDs(t testing.TB, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s", dir)
	}
	sort.Strings(files)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, f := range files {
		for _, crd := range c.ApplyFile(t, f) {
			if crd.GetKind() != "CustomResourceDefinition" {
				continue
			}
			if err := c.waitEstablished(ctx, crd.GetName()); err != nil {
				t.Fatalf("%s: CRD %s: %s", f, crd.GetName(), err)
			}
		}
	}
	c.mapper.Reset()
}

func (c *Cluster) waitEstablished(ctx context.Context, name string) error {
	for {
		crd, err := c.dyn.Resource(crds).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, cond := range conds {
			m, _ := cond.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return nil
			}
			if m["type"] == "NamesAccepted" && m["status"] == "False" {
				return fmt.Errorf("names not accepted: %v", m["message"])
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not established: %w (conditions %v)", ctx.Err(), conds)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func name(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}

func unstructuredOf(m map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: m}
}

func ptr[T any](v T) *T { return &v }
