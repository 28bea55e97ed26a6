package endpoints

import (
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
)

// Cell provides the policy-endpoints and cluster-policy-endpoints tables,
// each written by one writer (the source, or a test that plays it).
var Cell = cell.Group(
	cell.ProvidePrivate(NewPolicyEndpointsTable),
	cell.Provide(statedb.RWTable[*PolicyEndpoint].ToTable),
	cell.ProvidePrivate(NewClusterPolicyEndpointsTable),
	cell.Provide(statedb.RWTable[*ClusterPolicyEndpoint].ToTable),
)
