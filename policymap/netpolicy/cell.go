package netpolicy

import (
	"github.com/cilium/hive/cell"

	"github.com/enimasq/enimasq/policymap/netpolicy/compile"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
	"github.com/enimasq/enimasq/policymap/netpolicy/source"
)

// Cell reads PolicyEndpoint objects into policy-endpoints, compiles them
// into policy-map-entries, reconciles that into the network-policy maps
// enimasq_egress_v4/_v6 and enimasq_ingress_v4/_v6 and puts the policy
// programs on the pods' devices (with --enable-network-policy). It goes in
// [policymap.Module]. Its parts meet through tables:
//
//   - endpoints: the policy-endpoints table;
//   - source: the PolicyEndpoint directory or the API server →
//     policy-endpoints;
//   - compile: policy-endpoints → policy-map-entries → the policy maps;
//   - enforce: the pods of policy-endpoints → the programs on their
//     devices (policy-attachments, policy-bindings);
//   - fqdn (FQDNCell, the standalone agent's): the lookups of the pods
//     that name rules select → policy-fqdn (the names' addresses, which
//     compile allows).
//
// This package alone turns the flags into the parts' settings
// (newPartSettings) and hands enforce what it needs of the others
// (enforcing.go); it holds the policy maps' script commands (script.go).
var Cell = cell.Group(
	cell.Config(DefaultPolicyConfig),
	cell.ProvidePrivate(newPartSettings),
	endpoints.Cell,
	source.Cell,
	compile.Cell,
	cell.Provide(policyScriptCommands),
	enforceCells,
)
