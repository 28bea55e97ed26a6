package source

import "github.com/enimasq/enimasq/policymap/netpolicy/endpoints"

// The rows of policy-endpoints and cluster-policy-endpoints (package
// endpoints) that the source writes, by the names its decoder (kind_pe.go,
// kind_cpe.go) uses: aliases, the same types.
type (
	PolicyEndpoint        = endpoints.PolicyEndpoint
	PodEndpoint           = endpoints.PodEndpoint
	Rule                  = endpoints.Rule
	Port                  = endpoints.Port
	ClusterPolicyEndpoint = endpoints.ClusterPolicyEndpoint
	ClusterRule           = endpoints.ClusterRule
)
