package policymap

import (
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
)

// Cell reconciles the BPF LPM maps: masq-map-entries into Cilium's
// cilium_ipmasq_v4/_v6, and (with --enable-network-policy) the PolicyEndpoint
// directory into policy-endpoints, policy-map-entries and the network-policy
// maps enimasq_egress_v4/_v6 and enimasq_ingress_v4/_v6.
var Cell = cell.Module(
	"policymap",
	"BPF LPM maps from statedb tables",

	cell.Config(DefaultConfig),
	cell.ProvidePrivate(
		NewMasqTable,
		newMasqMapOps,
	),
	cell.Provide(
		statedb.RWTable[*MasqEntry].ToTable,
		scriptCommands,
		tableMetrics[*MasqEntry],
	),
	cell.Invoke(registerMasq),

	policySourceCell,
	policyMapCells,
)

// policySourceCell fills policy-endpoints from the PolicyEndpoint directory.
var policySourceCell = cell.Invoke(registerPolicySource)

// policyMapCells are the network-policy tables, the compiler and the
// reconciler of the policy maps: everything but the file source, which
// tests replace by writing policy-endpoints themselves.
var policyMapCells = cell.Group(
	cell.Config(DefaultPolicyConfig),
	cell.ProvidePrivate(
		NewPolicyEndpointsTable,
		NewPolicyMapEntriesTable,
		newPolicyMapOps,
		newPolicyState,
		newPolicyMetrics,
	),
	cell.Provide(
		statedb.RWTable[*PolicyEndpoint].ToTable,
		statedb.RWTable[*PolicyMapEntry].ToTable,
		policyScriptCommands,
		tableMetrics[*PolicyMapEntry],
		(*policyMetrics).collectors,
	),
	cell.Invoke(registerPolicyMaps),
)
