package compile

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
	"github.com/enimasq/enimasq/policymap/netpolicy/source"
)

// rawClusterRule is an ingress or egress entry of a ClusterPolicyEndpoint.
type rawClusterRule struct {
	CIDR   string    `json:"cidr"`
	Ports  []rawPort `json:"ports,omitempty"`
	Action string    `json:"action"`
}

// rawCPE is a ClusterPolicyEndpoint as generated; StandIn makes it the
// stand-in of an unreadable object that selects Pods (its tier, priority
// and rules are then not written).
type rawCPE struct {
	Name string
	// Policy is the parent policy when the object is a slice of another
	// object's (see rawPE).
	Policy   string
	Tier     string
	Priority int
	Pods     []rawPod
	Ingress  []rawClusterRule
	Egress   []rawClusterRule
	StandIn  bool
}

// clusterScenario is a set of PolicyEndpoints (NP) and
// ClusterPolicyEndpoints.
type clusterScenario struct {
	NP   scenario
	CPEs []rawCPE
}

func (s clusterScenario) clone() clusterScenario {
	b, _ := json.Marshal(s)
	var c clusterScenario
	if err := json.Unmarshal(b, &c); err != nil {
		panic(err)
	}
	return c
}

// policy is the object's parent policy.
func (c rawCPE) policy() string {
	if c.Policy != "" {
		return c.Policy
	}
	return c.Name
}

// render writes the scenario as one List of both kinds; stand-ins are
// listed in a comment (they are made, not read: see parseCluster).
func (s clusterScenario) render() string {
	var items []any
	for _, pe := range s.NP.PEs {
		items = append(items, map[string]any{
			"apiVersion": source.PolicyEndpointAPIVersion,
			"kind":       source.PolicyEndpointKind,
			"metadata":   map[string]string{"name": pe.Name, "namespace": "prop"},
			"spec": map[string]any{
				"policyRef":            map[string]string{"name": pe.policy()},
				"podIsolation":         pe.Isolation,
				"podSelectorEndpoints": pe.Pods,
				"ingress":              pe.Ingress,
				"egress":               pe.Egress,
			},
		})
	}
	var standIns []string
	for _, c := range s.CPEs {
		if c.StandIn {
			var pods []string
			for _, p := range c.Pods {
				pods = append(pods, p.PodIP+"@"+p.HostIP)
			}
			standIns = append(standIns, fmt.Sprintf("# stand-in %s: pods %s", c.Name, strings.Join(pods, ", ")))
			continue
		}
		items = append(items, map[string]any{
			"apiVersion": source.PolicyEndpointAPIVersion,
			"kind":       source.ClusterPolicyEndpointKind,
			"metadata":   map[string]string{"name": c.Name},
			"spec": map[string]any{
				"policyRef":            map[string]string{"name": c.policy()},
				"tier":                 c.Tier,
				"priority":             c.Priority,
				"podSelectorEndpoints": c.Pods,
				"ingress":              c.Ingress,
				"egress":               c.Egress,
			},
		})
	}
	b, err := json.MarshalIndent(map[string]any{"apiVersion": "v1", "kind": "List", "items": items}, "", " ")
	if err != nil {
		panic(err)
	}
	return strings.Join(append(standIns, string(b)), "\n")
}

// parseCluster parses the scenario's file into both kinds, and makes the
// stand-ins as the source does for an unreadable object without a last
// good version (recover_cluster.go: its pods, Admin, priority 0, no rules).
func (s clusterScenario) parseCluster(t testing.TB) ([]*endpoints.PolicyEndpoint, []*endpoints.ClusterPolicyEndpoint) {
	t.Helper()
	text := s.render()
	if i := strings.Index(text, "{"); i > 0 {
		text = text[i:] // the stand-ins' comments are not JSON
	}
	pes, err := source.ParsePolicyEndpoints("scenario.json", []byte(text))
	if err != nil {
		t.Fatalf("generated file does not parse: %s\n%s", err, text)
	}
	cpes, err := source.ParseClusterPolicyEndpoints("scenario.json", []byte(text))
	if err != nil {
		t.Fatalf("generated file does not parse: %s\n%s", err, text)
	}
	for _, c := range s.CPEs {
		if !c.StandIn {
			continue
		}
		stand := &endpoints.ClusterPolicyEndpoint{Name: c.Name, File: "scenario.json", PolicyRef: c.policy(), Tier: endpoints.TierAdmin,
			Invalid: "generated stand-in", StandIn: true}
		for _, p := range c.Pods {
			stand.Pods = append(stand.Pods, endpoints.PodEndpoint{PodIP: netip.MustParseAddr(p.PodIP), HostIP: netip.MustParseAddr(p.HostIP)})
		}
		cpes = append(cpes, stand)
	}
	return pes, cpes
}
