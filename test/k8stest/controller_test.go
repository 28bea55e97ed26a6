package k8stest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/test/k8stest"
)

// TestControllerWritesPolicyEndpoints: the AWS network policy controller
// v1.1.10, run against the API server, turns a NetworkPolicy into a
// PolicyEndpoint from the pods as a kubelet reports them: the selected pod
// (its status.podIP and status.hostIP: the first address of each of a
// dual-stack pod), the peer pod's IP, and the named port resolved on the
// selected pod's container. Restarted with a chunk size of 1, it cuts the
// policy into slices of one peer each.
func TestControllerWritesPolicyEndpoints(t *testing.T) {
	c := k8stest.Start(t)
	ctl := k8stest.StartController(t, c, 200)

	c.MustApply(t, object(t, `
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: shop}}
`))
	web := c.RunningPod(t, "shop", "web-0", "node-1", "10.0.1.5,fd00:10::5", "192.168.0.1,fd00:192::1",
		map[string]string{"app": "web"}, corev1.ContainerPort{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP})
	if web.Status.Phase != corev1.PodRunning || len(web.Status.PodIPs) != 2 || len(web.Status.HostIPs) != 2 || web.Spec.NodeName != "node-1" {
		t.Fatalf("pod web-0 as the API server has it: %+v %+v", web.Spec, web.Status)
	}
	c.RunningPod(t, "shop", "client-0", "node-2", "10.0.2.7", "192.168.0.2", map[string]string{"app": "client"})
	c.MustApply(t, object(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {app: client}}
    ports:
    - {protocol: TCP, port: http}
`))

	want := map[string]any{
		"policyRef":    map[string]any{"name": "web", "namespace": "shop"},
		"podIsolation": []any{"Ingress"},
		"podSelector":  map[string]any{"matchLabels": map[string]any{"app": "web"}},
		"podSelectorEndpoints": []any{
			map[string]any{"hostIP": "192.168.0.1", "podIP": "10.0.1.5", "name": "web-0", "namespace": "shop"},
		},
		"ingress": []any{
			map[string]any{"cidr": "10.0.2.7", "ports": []any{map[string]any{"protocol": "TCP", "port": int64(8080)}}},
		},
	}
	got := waitPolicyEndpoints(t, c, "shop", func(pes []unstructured.Unstructured) bool {
		return len(pes) == 1 && reflect.DeepEqual(pes[0].Object["spec"], want)
	})
	pe := got[0]
	if !strings.HasPrefix(pe.GetName(), "web-") || len(pe.GetOwnerReferences()) != 1 || pe.GetOwnerReferences()[0].Kind != "NetworkPolicy" {
		t.Errorf("PolicyEndpoint %s, owners %v: want web-<suffix>, owned by the NetworkPolicy", pe.GetName(), pe.GetOwnerReferences())
	}
	t.Logf("the controller wrote:\n%s", yamlOf(t, pe.Object))

	// Slices of one: a second peer gives a second slice, both of the
	// policy web, between them the pod and both peers.
	ctl.Restart(t, 1)
	if ctl.ChunkSize() != 1 {
		t.Fatalf("chunk size %d after Restart(1)", ctl.ChunkSize())
	}
	c.RunningPod(t, "shop", "client-1", "node-2", "10.0.2.8", "192.168.0.2", map[string]string{"app": "client"})
	got = waitPolicyEndpoints(t, c, "shop", func(pes []unstructured.Unstructured) bool {
		var peers []string
		for _, pe := range pes {
			ingress, _, _ := unstructured.NestedSlice(pe.Object, "spec", "ingress")
			if ref, _, _ := unstructured.NestedString(pe.Object, "spec", "policyRef", "name"); ref != "web" || len(ingress) != 1 {
				return false
			}
			peers = append(peers, ingress[0].(map[string]any)["cidr"].(string))
		}
		slices.Sort(peers)
		return slices.Equal(peers, []string{"10.0.2.7", "10.0.2.8"})
	})
	t.Logf("at chunk size 1:\n%s", yamlOf(t, got))
}

// waitPolicyEndpoints waits until the PolicyEndpoints of ns satisfy ok,
// and returns them (without managedFields).
func waitPolicyEndpoints(t *testing.T, c *k8stest.Cluster, ns string, ok func([]unstructured.Unstructured) bool) []unstructured.Unstructured {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		list, err := c.Dynamic().Resource(k8sclient.PolicyEndpoints).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, pe := range list.Items {
			unstructured.RemoveNestedField(pe.Object, "metadata", "managedFields")
		}
		if ok(list.Items) {
			return list.Items
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the controller's PolicyEndpoints in %s are not as expected:\n%s", ns, yamlOf(t, list.Items))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestControllerCRDs: the PolicyEndpoint and ClusterPolicyEndpoint CRDs of
// Documentation/deploy/network-policy/crds and test/k8stest/crds are the
// files of the controller's module at the version its build pins, byte for
// byte (`make crds` copies them), and that version is ControllerVersion.
func TestControllerCRDs(t *testing.T) {
	mod := controllerModule(t)
	if mod.Version != k8stest.ControllerVersion {
		t.Errorf("controller-build/go.mod requires %s %s, k8stest.ControllerVersion is %s", k8stest.ControllerModule, mod.Version, k8stest.ControllerVersion)
	}
	repo := filepath.Join(k8stest.SourceDir(), "..", "..")
	for dir, plurals := range map[string][]string{
		filepath.Join("Documentation", "deploy", "network-policy", "crds"): {"policyendpoints", "clusterpolicyendpoints"},
		filepath.Join("test", "k8stest", "crds"):                           {"policyendpoints"},
	} {
		// Every CRD of the group there, and at least those listed.
		files, _ := filepath.Glob(filepath.Join(repo, dir, "*.networking.k8s.aws.yaml"))
		seen := map[string]bool{}
		for _, f := range files {
			seen[strings.TrimSuffix(filepath.Base(f), ".networking.k8s.aws.yaml")] = true
		}
		for _, p := range plurals {
			if !seen[p] {
				t.Errorf("%s: no %s.networking.k8s.aws.yaml: run `make crds`", dir, p)
			}
		}
		for p := range seen {
			name := filepath.Join(dir, p+".networking.k8s.aws.yaml")
			theirs := filepath.Join("config", "crd", "bases", "networking.k8s.aws_"+p+".yaml")
			got, err := os.ReadFile(filepath.Join(repo, name))
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(filepath.Join(mod.Dir, theirs))
			if err != nil {
				t.Errorf("%s: the module has no %s: %s", name, theirs, err)
				continue
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s is not %s@%s %s: run `make crds`", name, k8stest.ControllerModule, mod.Version, theirs)
			}
		}
	}
}

// controllerModule is the controller's module as controller-build/go.mod
// requires it, from the module cache (`go mod download` checks it against
// that go.sum; offline once it is there). It skips as a user who cannot
// use the Go caches (make test-unprivileged: they are the builder's).
func controllerModule(t *testing.T) (mod struct{ Version, Dir, Error string }) {
	t.Helper()
	goTool := os.Getenv("GO")
	if goTool == "" {
		goTool = "go"
	}
	cmd := exec.Command(goTool, "mod", "download", "-json", k8stest.ControllerModule)
	cmd.Dir = filepath.Join(k8stest.SourceDir(), "controller-build")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if jerr := json.Unmarshal(out, &mod); jerr != nil || err != nil || mod.Error != "" || mod.Dir == "" {
		msg := stderr.String() + mod.Error
		if strings.Contains(msg, "permission denied") {
			t.Skipf("go mod download cannot use the Go caches as this user: %s", strings.TrimSpace(msg))
		}
		t.Fatalf("go mod download -json %s in %s: %v %v: %s", k8stest.ControllerModule, cmd.Dir, err, jerr, msg)
	}
	return mod
}

func object(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	objs, err := k8stest.Decode(strings.NewReader(doc))
	if err != nil || len(objs) != 1 {
		t.Fatalf("%v: %d objects in %s", err, len(objs), doc)
	}
	return objs[0]
}

func yamlOf(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
