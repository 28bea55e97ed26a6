package policymap

import "github.com/cilium/hive/cell"

// Module is the policymap module with the given map features (the
// masquerade maps of package masqmap, the network-policy maps of package
// netpolicy): the flags they share, and one health tree for all.
func Module(features ...cell.Cell) cell.Cell {
	return cell.Module(
		"policymap",
		"BPF LPM maps from statedb tables",
		append([]cell.Cell{cell.Config(DefaultConfig)}, features...)...,
	)
}
