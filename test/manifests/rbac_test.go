package manifests

import (
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// policyReaders are the ClusterRoles that let enimasq's agent read the
// objects of the AWS network policy controller, by kustomization, and the
// service account each is bound to: the standalone agent's (network-policy
// takes the base's), and the one beside Cilium's chart for the Cilium
// build, bound to the chart's agent service account.
var policyReaders = []struct{ dir, role, sa string }{
	{"standalone", "enimasq", "kube-system/enimasq"},
	{"network-policy", "enimasq", "kube-system/enimasq"},
	{"cilium", "cilium-enimasq", "kube-system/cilium"},
}

// TestReadsBothPolicyKinds: in every manifest that runs enimasq, the agent
// may get, list and watch the PolicyEndpoints and the
// ClusterPolicyEndpoints (networking.k8s.aws), and nothing more of them: a
// ClusterRole without clusterpolicyendpoints leaves the agent without the
// Admin and Baseline tiers. The role is bound to the agent's service
// account.
func TestReadsBothPolicyKinds(t *testing.T) {
	for _, pr := range policyReaders {
		t.Run(pr.dir, func(t *testing.T) {
			objs := render(t, filepath.Join(deployDir, pr.dir))
			role := find(objs, "ClusterRole", pr.role)
			if role == nil {
				t.Fatalf("no ClusterRole %s", pr.role)
			}
			for _, resource := range []string{"policyendpoints", "clusterpolicyendpoints"} {
				if verbs := verbsOn(role, "networking.k8s.aws", resource); !slices.Equal(verbs, []string{"get", "list", "watch"}) {
					t.Errorf("ClusterRole %s: %s verbs %v, want get, list, watch", pr.role, resource, verbs)
				}
			}
			bound := false
			for _, o := range objs {
				if o.GetKind() != "ClusterRoleBinding" || field(o.Object, "roleRef", "name") != pr.role {
					continue
				}
				for _, s := range field(o.Object, "subjects").([]any) {
					s := s.(map[string]any)
					if s["kind"] == "ServiceAccount" && s["namespace"].(string)+"/"+s["name"].(string) == pr.sa {
						bound = true
					}
				}
			}
			if !bound {
				t.Errorf("no ClusterRoleBinding of %s to the service account %s", pr.role, pr.sa)
			}
		})
	}
}

// verbsOn lists, sorted, the verbs the role's rules grant on resource of
// group.
func verbsOn(role *unstructured.Unstructured, group, resource string) []string {
	var verbs []string
	for _, r := range field(role.Object, "rules").([]any) {
		r := r.(map[string]any)
		groups, _ := r["apiGroups"].([]any)
		resources, _ := r["resources"].([]any)
		if slices.Contains(groups, any(group)) && slices.Contains(resources, any(resource)) {
			for _, v := range r["verbs"].([]any) {
				verbs = append(verbs, v.(string))
			}
		}
	}
	slices.Sort(verbs)
	return slices.Compact(verbs)
}

// TestPolicyCRDs: network-policy/crds holds the controller's CRDs of both
// kinds (test/k8stest checks that they are its module's files), with their
// scopes, and nothing else.
func TestPolicyCRDs(t *testing.T) {
	objs := render(t, filepath.Join(deployDir, "network-policy", "crds"))
	want := map[string]string{
		"policyendpoints.networking.k8s.aws":        "Namespaced",
		"clusterpolicyendpoints.networking.k8s.aws": "Cluster",
	}
	if len(objs) != len(want) {
		t.Errorf("network-policy/crds: %d objects, want %d", len(objs), len(want))
	}
	for name, scope := range want {
		crd := find(objs, "CustomResourceDefinition", name)
		if crd == nil {
			t.Errorf("network-policy/crds: no CRD %s", name)
			continue
		}
		if got := field(crd.Object, "spec", "scope"); got != scope {
			t.Errorf("CRD %s: scope %v, want %s", name, got, scope)
		}
	}
}
