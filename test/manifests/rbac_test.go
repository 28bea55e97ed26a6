package manifests

import (
	"path/filepath"
	"slices"
	"testing"
)

// TestNetworkPolicyReadsClusterPolicyEndpoints: the network-policy
// kustomization's ClusterRole lets the agent get, list and watch the
// ClusterPolicyEndpoints (cluster-scoped), and nothing more of them; the
// CRD of crds/ is the resource it names.
func TestNetworkPolicyReadsClusterPolicyEndpoints(t *testing.T) {
	role := find(render(t, filepath.Join(deployDir, "network-policy")), "ClusterRole", "enimasq")
	if role == nil {
		t.Fatal("no ClusterRole enimasq")
	}
	var verbs []string
	for _, r := range field(role.Object, "rules").([]any) {
		r := r.(map[string]any)
		if slices.Contains(r["apiGroups"].([]any), "networking.k8s.aws") && slices.Contains(r["resources"].([]any), "clusterpolicyendpoints") {
			for _, v := range r["verbs"].([]any) {
				verbs = append(verbs, v.(string))
			}
		}
	}
	slices.Sort(verbs)
	if !slices.Equal(verbs, []string{"get", "list", "watch"}) {
		t.Errorf("clusterpolicyendpoints verbs %v, want get, list, watch", verbs)
	}
	crd := find(render(t, filepath.Join(deployDir, "network-policy", "crds")), "CustomResourceDefinition", "clusterpolicyendpoints.networking.k8s.aws")
	if crd == nil {
		t.Fatal("network-policy/crds: no CRD clusterpolicyendpoints.networking.k8s.aws")
	}
	if scope := field(crd.Object, "spec", "scope"); scope != "Cluster" {
		t.Errorf("CRD scope %v, want Cluster", scope)
	}
}
