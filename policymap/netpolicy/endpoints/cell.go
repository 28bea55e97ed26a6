package endpoints

import "github.com/cilium/hive/cell"

// Cell provides a table per kind (policy-endpoints and
// cluster-policy-endpoints), each written by one writer (the source, or a
// test that plays it), and policy-fqdn, the names pods were told (names.go).
var Cell = cell.Group(
	PolicyEndpoints.Cell(),
	ClusterPolicyEndpoints.Cell(),
	dnsNamesCell,
)
