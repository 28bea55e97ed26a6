// Package ciliumnode is the source part of ipam: it reads the node's
// CiliumNode (a file, or with the API server the CiliumNode named after the
// node) into the enis table, one row per ENI with its pool IPs, and the ENIs'
// primary IPs into node-ips. A CiliumNode that goes bad, or disappears,
// leaves the last ENIs in force; what leaves it is held for
// --ciliumnode-loss-grace (hold.go), so a CiliumNode briefly cut short costs
// no running pod its rules.
//
// It also holds what is derived from the rows alone and that both the
// allocator and the datapath use: the pool (pool.go) and the CIDRs of an
// allocation result (ResultCIDRs), which the pod's egress rules follow.
package ciliumnode
