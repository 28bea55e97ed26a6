// Package allocations is the ipam-allocations table: one row per pod IP
// handed out on this node, with its owner, its attachment and the ENI it is
// on. It has one writer, enimasq's allocator (package allocator) or the
// embedding agent's pod set (package podset), and the datapath reads it.
package allocations
