package policymap

import (
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
)

// Cell reconciles the BPF LPM maps: masq-map-entries into Cilium's
// cilium_ipmasq_v4/_v6.
var Cell = cell.Module(
	"policymap",
	"BPF LPM maps from statedb tables",

	cell.Config(DefaultConfig),
	cell.ProvidePrivate(
		NewMasqTable,
		newMapOps[*MasqEntry],
	),
	cell.Provide(
		statedb.RWTable[*MasqEntry].ToTable,
		scriptCommands,
	),
	cell.Invoke(registerMasq),
)
