package manifests

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/enimasq/enimasq/test/k8stest"
)

// deployDir is Documentation/deploy; the tests run in test/manifests.
var deployDir = filepath.Join("..", "..", "Documentation", "deploy")

// placeholder is the image the DaemonSet names until an operator sets it.
const placeholder = "registry.invalid/enimasq:set-the-image"

// kustomizations lists every directory under Documentation/deploy with a
// kustomization.yaml, relative to deployDir.
func kustomizations(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(deployDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "kustomization.yaml" {
			rel, _ := filepath.Rel(deployDir, filepath.Dir(path))
			dirs = append(dirs, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(dirs)
	if !slices.Contains(dirs, "standalone") || !slices.Contains(dirs, "network-policy") {
		t.Fatalf("kustomizations in %s: %v, want standalone and network-policy among them", deployDir, dirs)
	}
	return dirs
}

// render builds the kustomization in dir as `kubectl kustomize dir` does.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %s", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := k8stest.Decode(bytes.NewReader(out))
	if err != nil {
		t.Fatalf("kustomize build %s: %s", dir, err)
	}
	if len(objs) == 0 {
		t.Fatalf("kustomize build %s: no objects", dir)
	}
	return objs
}

func renderAll(t *testing.T) map[string][]*unstructured.Unstructured {
	out := map[string][]*unstructured.Unstructured{}
	for _, dir := range kustomizations(t) {
		out[dir] = render(t, filepath.Join(deployDir, dir))
	}
	return out
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// TestKustomizationsRender: every kustomization renders, and every manifest
// under Documentation/deploy is a resource or a patch of one of them, so
// that the dry run below sees each of them.
func TestKustomizationsRender(t *testing.T) {
	listed := map[string]bool{} // files named by a kustomization, relative to deployDir
	for _, dir := range kustomizations(t) {
		objs := render(t, filepath.Join(deployDir, dir))
		t.Logf("%s: %d objects", dir, len(objs))
		data, err := os.ReadFile(filepath.Join(deployDir, dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var k struct {
			Resources []string `json:"resources"`
			Patches   []struct {
				Path string `json:"path"`
			} `json:"patches"`
		}
		if err := yaml.Unmarshal(data, &k); err != nil {
			t.Fatal(err)
		}
		for _, r := range k.Resources {
			listed[filepath.Join(dir, r)] = true
		}
		for _, p := range k.Patches {
			if p.Path != "" {
				listed[filepath.Join(dir, p.Path)] = true
			}
		}
	}
	err := filepath.WalkDir(deployDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") || d.Name() == "kustomization.yaml" {
			return err
		}
		rel, _ := filepath.Rel(deployDir, path)
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		objs, err := k8stest.Decode(bytes.NewReader(data))
		if err != nil {
			// Not a Kubernetes manifest (Helm values: cilium/values.yaml).
			t.Logf("%s: not a manifest (%s)", rel, err)
			return nil
		}
		if len(objs) > 0 && !listed[rel] {
			t.Errorf("%s holds %d objects but no kustomization lists it", rel, len(objs))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestImagePlaceholder: until it is set, every container's image is the
// placeholder, on the .invalid domain (RFC 6761: it never resolves, so a
// pull fails naming it); `kustomize edit set image` with the name the
// kustomization gives sets every container of every kustomization.
func TestImagePlaceholder(t *testing.T) {
	for dir, objs := range renderAll(t) {
		for _, o := range objs {
			for _, ctr := range podContainers(t, o) {
				if ctr["image"] != placeholder {
					t.Errorf("%s: %s %s container %s: image %v, want the placeholder %s", dir, o.GetKind(), o.GetName(), ctr["name"], ctr["image"], placeholder)
				}
			}
		}
	}

	// An overlay as `kustomize edit set image registry.invalid/enimasq=...`
	// writes it, over each kustomization.
	for _, dir := range kustomizations(t) {
		overlay := t.TempDir()
		base, err := filepath.Abs(filepath.Join(deployDir, dir))
		if err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(overlay, base)
		if err != nil {
			t.Fatal(err)
		}
		k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- " + rel +
			"\nimages:\n- name: registry.invalid/enimasq\n  newName: registry.example.com/enimasq\n  newTag: v1.2.3\n"
		if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, o := range render(t, overlay) {
			for _, ctr := range podContainers(t, o) {
				n++
				if ctr["image"] != "registry.example.com/enimasq:v1.2.3" {
					t.Errorf("%s with the image set: container %s: image %v", dir, ctr["name"], ctr["image"])
				}
			}
		}
		// Only the monitoring kustomizations, a CRD's (crds/) and the
		// RBAC beside Cilium's chart (cilium/: Cilium's chart runs the
		// agent) have no workload.
		if (strings.HasPrefix(dir, "monitoring") || filepath.Base(dir) == "crds" || dir == "cilium") != (n == 0) {
			t.Errorf("%s: %d containers", dir, n)
		}
	}
}

// podContainers returns the init containers and containers of a workload.
func podContainers(t *testing.T, o *unstructured.Unstructured) []map[string]any {
	t.Helper()
	if o.GetKind() != "DaemonSet" {
		return nil
	}
	var out []map[string]any
	for _, field := range []string{"initContainers", "containers"} {
		list, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range list {
			out = append(out, c.(map[string]any))
		}
	}
	return out
}

func container(t *testing.T, ds *unstructured.Unstructured, name string) map[string]any {
	t.Helper()
	for _, c := range podContainers(t, ds) {
		if c["name"] == name {
			return c
		}
	}
	return nil
}

func names(list []any) []string {
	var out []string
	for _, v := range list {
		out = append(out, v.(map[string]any)["name"].(string))
	}
	slices.Sort(out)
	return out
}
