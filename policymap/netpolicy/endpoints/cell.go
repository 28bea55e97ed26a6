package endpoints

import "github.com/cilium/hive/cell"

// Cell provides a table per kind (policy-endpoints and
// cluster-policy-endpoints), each written by one writer (the source, or a
// test that plays it). policy-fqdn, the names pods were told (names.go),
// is DNSNamesCell's, which the domain names' part provides (netpolicy.FQDNCell).
var Cell = cell.Group(
	PolicyEndpoints.Cell(),
	ClusterPolicyEndpoints.Cell(),
)
