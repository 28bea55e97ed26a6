package k8stest_test

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/enimasq/enimasq/test/agentargs"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/enimasq/enimasq/ipmasq"
	"github.com/enimasq/enimasq/test/k8stest"
)

// deployDir holds the standalone agent's manifests; test/manifests renders
// every kustomization of Documentation/deploy and dry-runs all of them.
var deployDir = filepath.Join(k8stest.SourceDir(), "..", "..", "Documentation", "deploy", "standalone")

func deployObjects(t *testing.T, file string) []*unstructured.Unstructured {
	return k8stest.DecodeFile(t, filepath.Join(deployDir, file))
}

// TestKustomization: `kubectl apply -k Documentation/deploy/standalone`
// applies every manifest there, and the image it renames is the DaemonSet's.
func TestKustomization(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(deployDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
		Images    []struct {
			Name string `json:"name"`
		} `json:"images"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	var manifests []string
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" {
			manifests = append(manifests, base)
		}
	}
	slices.Sort(k.Resources)
	if !slices.Equal(k.Resources, manifests) {
		t.Errorf("kustomization.yaml resources %v, the directory has %v", k.Resources, manifests)
	}
	ds := deployObjects(t, "daemonset.yaml")[0]
	for _, ctr := range containers(t, ds) {
		image, _, _ := strings.Cut(ctr["image"].(string), ":")
		if len(k.Images) != 1 || k.Images[0].Name != image {
			t.Errorf("container %s: image %s is not the one kustomization.yaml renames (%v)", ctr["name"], image, k.Images)
		}
	}
}

// TestDeployManifests applies the CRDs (Start does), the RBAC and the
// ConfigMap to a real API server with strict field validation, twice (the
// second apply changes nothing), and passes the DaemonSet through a
// server-side dry run. The manifests agree with each other and with the
// agent: the DaemonSet's service account and ConfigMap exist, its flags are
// the agent's, the ConfigMap's config is valid, and the ClusterRole grants
// exactly what the agent uses.
func TestDeployManifests(t *testing.T) {
	c := k8stest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var applied []*unstructured.Unstructured
	for _, f := range []string{"rbac.yaml", "ip-masq-agent.yaml", "cni-config.yaml"} {
		first := c.MustApply(t, deployObjects(t, f)...)
		again := c.MustApply(t, deployObjects(t, f)...)
		for i := range first {
			if first[i].GetResourceVersion() != again[i].GetResourceVersion() {
				t.Errorf("%s: applying %s %s again changed it", f, first[i].GetKind(), first[i].GetName())
			}
		}
		applied = append(applied, first...)
	}

	ds := deployObjects(t, "daemonset.yaml")
	if len(ds) != 1 || ds[0].GetKind() != "DaemonSet" {
		t.Fatalf("daemonset.yaml holds %d objects, want one DaemonSet", len(ds))
	}
	res, err := c.Apply(ctx, ds[0], k8stest.DryRun())
	if err != nil {
		t.Fatalf("server-side dry run: %s", err)
	}
	if res.GetUID() == "" || res.GetNamespace() != "kube-system" {
		t.Fatalf("dry run answered %s/%s uid %q", res.GetNamespace(), res.GetName(), res.GetUID())
	}
	if _, err := c.Get(ctx, ds[0]); !apierrors.IsNotFound(err) {
		t.Fatalf("the dry run stored the DaemonSet: %v", err)
	}

	t.Run("consistent", func(t *testing.T) { checkDaemonSet(t, ds[0], applied) })
	t.Run("rbac", func(t *testing.T) { checkRBAC(t, ctx, c) })
}

func containers(t *testing.T, ds *unstructured.Unstructured) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, field := range []string{"initContainers", "containers"} {
		list, _, err := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", field)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range list {
			out = append(out, c.(map[string]any))
		}
	}
	return out
}

func checkDaemonSet(t *testing.T, ds *unstructured.Unstructured, applied []*unstructured.Unstructured) {
	byKind := map[string]*unstructured.Unstructured{} // the ConfigMap: ip-masq-agent
	for _, o := range applied {
		if o.GetKind() != "ConfigMap" || o.GetName() == "ip-masq-agent" {
			byKind[o.GetKind()] = o
		}
	}
	spec := func(path ...string) any {
		v, _, _ := unstructured.NestedFieldNoCopy(ds.Object, append([]string{"spec", "template", "spec"}, path...)...)
		return v
	}
	if spec("hostNetwork") != true {
		t.Error("not on the host network")
	}
	sa := byKind["ServiceAccount"]
	if spec("serviceAccountName") != sa.GetName() || ds.GetNamespace() != sa.GetNamespace() {
		t.Errorf("service account %v in %s, rbac.yaml has %s/%s", spec("serviceAccountName"), ds.GetNamespace(), sa.GetNamespace(), sa.GetName())
	}

	var agent map[string]any
	for _, ctr := range containers(t, ds) {
		if ctr["name"] == "agent" {
			agent = ctr
		}
	}
	if agent == nil {
		t.Fatal("no agent container")
	}
	// Not privileged: the capabilities it uses (test/manifests checks the
	// rest of the DaemonSet).
	if priv, _, _ := unstructured.NestedBool(agent, "securityContext", "privileged"); priv {
		t.Error("agent privileged")
	}
	if add, _, _ := unstructured.NestedStringSlice(agent, "securityContext", "capabilities", "add"); !slices.Contains(add, "NET_ADMIN") {
		t.Errorf("agent capabilities %v", add)
	}

	// The flags are the agent's own.
	fs, err := agentargs.Parse(agent)
	if err != nil {
		t.Fatal(err)
	}
	configPath, _ := fs.GetString("ip-masq-agent-config-path")

	// The ConfigMap is mounted where the agent reads it, and its config is
	// valid (no warnings either).
	mounts := map[string]string{} // volume -> mount path
	for _, m := range agent["volumeMounts"].([]any) {
		m := m.(map[string]any)
		mounts[m["name"].(string)] = m["mountPath"].(string)
	}
	cm := byKind["ConfigMap"]
	found := false
	for _, v := range spec("volumes").([]any) {
		v := v.(map[string]any)
		if src, ok := v["configMap"].(map[string]any); ok && src["name"] == cm.GetName() {
			for _, item := range src["items"].([]any) {
				item := item.(map[string]any)
				if filepath.Join(mounts[v["name"].(string)], item["path"].(string)) != configPath {
					continue
				}
				found = true
				data, _, _ := unstructured.NestedString(cm.Object, "data", item["key"].(string))
				d, err := ipmasq.Parse(configPath, []byte(data))
				if err != nil || len(d.Warnings) > 0 || len(d.CIDRs) == 0 {
					t.Errorf("ConfigMap %s key %s: %v, warnings %v, %d CIDRs", cm.GetName(), item["key"], err, d.Warnings, len(d.CIDRs))
				}
			}
		}
	}
	if !found {
		t.Errorf("ConfigMap %s is not mounted at --ip-masq-agent-config-path %s", cm.GetName(), configPath)
	}
	for _, path := range []string{"/sys/fs/bpf", "/var/run/enimasq"} {
		if !slices.Contains(slices.Collect(maps.Values(mounts)), path) {
			t.Errorf("%s is not mounted from the host", path)
		}
	}
}

// checkRBAC asks the RBAC authorizer what the agent's service account may
// do: what the agent uses, and nothing else.
func checkRBAC(t *testing.T, ctx context.Context, c *k8stest.Cluster) {
	sa := "system:serviceaccount:kube-system:enimasq"
	reviews := c.Dynamic().Resource(schema.GroupVersionResource{Group: "authorization.k8s.io", Version: "v1", Resource: "subjectaccessreviews"})
	for _, tc := range []struct {
		verb, group, resource, sub, ns string
		allowed                        bool
	}{
		{"get", "cilium.io", "ciliumnodes", "", "", true},
		{"list", "cilium.io", "ciliumnodes", "", "", true},
		{"watch", "cilium.io", "ciliumnodes", "", "", true},
		{"update", "cilium.io", "ciliumnodes", "status", "", true},
		{"patch", "cilium.io", "ciliumnodes", "status", "", true},
		{"list", "networking.k8s.aws", "policyendpoints", "", "", true},
		{"watch", "networking.k8s.aws", "policyendpoints", "", "", true},
		{"get", "networking.k8s.aws", "policyendpoints", "", "shop", true},
		{"get", "networking.k8s.aws", "clusterpolicyendpoints", "", "", true},
		{"list", "networking.k8s.aws", "clusterpolicyendpoints", "", "", true},
		{"watch", "networking.k8s.aws", "clusterpolicyendpoints", "", "", true},

		{"create", "cilium.io", "ciliumnodes", "", "", false},
		{"update", "cilium.io", "ciliumnodes", "", "", false},
		{"patch", "cilium.io", "ciliumnodes", "", "", false},
		{"delete", "cilium.io", "ciliumnodes", "", "", false},
		{"create", "networking.k8s.aws", "policyendpoints", "", "shop", false},
		{"update", "networking.k8s.aws", "policyendpoints", "", "shop", false},
		{"update", "networking.k8s.aws", "policyendpoints", "status", "shop", false},
		{"delete", "networking.k8s.aws", "policyendpoints", "", "shop", false},
		{"create", "networking.k8s.aws", "clusterpolicyendpoints", "", "", false},
		{"update", "networking.k8s.aws", "clusterpolicyendpoints", "", "", false},
		{"update", "networking.k8s.aws", "clusterpolicyendpoints", "status", "", false},
		{"delete", "networking.k8s.aws", "clusterpolicyendpoints", "", "", false},
		{"list", "networking.k8s.aws", "clusternetworkpolicies", "", "", false},
		{"list", "networking.k8s.io", "networkpolicies", "", "", false},
		{"list", "cilium.io", "ciliumendpoints", "", "", false},
		{"list", "", "pods", "", "", false},
		{"get", "", "nodes", "", "", false},
		{"get", "", "configmaps", "", "kube-system", false},
		{"list", "", "secrets", "", "kube-system", false},
		{"create", "", "events", "", "kube-system", false},
	} {
		attrs := map[string]any{"verb": tc.verb, "group": tc.group, "resource": tc.resource}
		if tc.sub != "" {
			attrs["subresource"] = tc.sub
		}
		if tc.ns != "" {
			attrs["namespace"] = tc.ns
		}
		review := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "authorization.k8s.io/v1",
			"kind":       "SubjectAccessReview",
			"spec": map[string]any{
				"user":               sa,
				"groups":             []any{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
				"resourceAttributes": attrs,
			},
		}}
		res, err := reviews.Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		allowed, _, _ := unstructured.NestedBool(res.Object, "status", "allowed")
		if allowed != tc.allowed {
			what := tc.verb + " " + tc.resource
			if tc.sub != "" {
				what += "/" + tc.sub
			}
			t.Errorf("%s %s: allowed %t, want %t", sa, what, allowed, tc.allowed)
		}
	}
}
