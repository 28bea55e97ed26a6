package source

import (
	"maps"
	"net/netip"
	"slices"
	"testing"
)

// The API source keeps, of the objects in the API server, those with pods
// on this node (only those pods), and the pod-less slices of their
// policies, whose rules are those pods' too; a slice of a policy without
// pods here is not this node's business.
func TestOnThisNodeKeepsSlicesOfLocalPolicies(t *testing.T) {
	here, there := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	pod := func(ip string, host netip.Addr) PodEndpoint {
		return PodEndpoint{PodIP: netip.MustParseAddr(ip), HostIP: host}
	}
	all := map[string]*PolicyEndpoint{
		"ns/web-a":   {Namespace: "ns", Name: "web-a", PolicyRef: "ns/web", Pods: []PodEndpoint{pod("10.1.0.1", here), pod("10.1.0.2", there)}},
		"ns/web-b":   {Namespace: "ns", Name: "web-b", PolicyRef: "ns/web", Pods: []PodEndpoint{pod("10.1.0.3", there)}},
		"ns/web-c":   {Namespace: "ns", Name: "web-c", PolicyRef: "ns/web"}, // rules only
		"ns/db-a":    {Namespace: "ns", Name: "db-a", PolicyRef: "ns/db", Pods: []PodEndpoint{pod("10.1.0.4", there)}},
		"ns/db-b":    {Namespace: "ns", Name: "db-b", PolicyRef: "ns/db"},
		"other/web":  {Namespace: "other", Name: "web", PolicyRef: "other/web"}, // the same name, another namespace
		"ns/no-pods": {Namespace: "ns", Name: "no-pods"},                        // a stand-in without a policyRef
	}
	addrs := map[netip.Addr]bool{here: true}
	got := onThisNode(all, func(pe *PolicyEndpoint) *PolicyEndpoint { return podsOnNode(pe, addrs) })
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, []string{"ns/web-a", "ns/web-b", "ns/web-c"}) {
		t.Fatalf("kept %v", keys)
	}
	if p := got["ns/web-a"].Pods; len(p) != 1 || p[0].HostIP != here {
		t.Errorf("web-a's pods %v, want only this node's", p)
	}
	if p := got["ns/web-b"].Pods; len(p) != 0 || len(all["ns/web-b"].Pods) != 1 {
		t.Errorf("web-b's pods %v (the object in the API server: %v), want none on a copy", p, all["ns/web-b"].Pods)
	}
}
