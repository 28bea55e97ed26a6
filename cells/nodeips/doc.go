// Package nodeips keeps the node-ips table: the IP addresses of this node,
// each with who reported it. The addresses of the agent's network namespace
// (source "netlink") are derived from the kernel-addrs table (cells/kernel:
// no subscription or listing of its own); the ENI IPAM writes its
// ENIs' primary IPs (source "eni"), which are the node's too although no
// interface of the namespace may carry them. Features that need to know
// "is this address one of this node's" read the table, so none of them
// imports another for it (the network-policy source tells the pods of this
// node this way).
//
// The table is Cilium's NodeAddress table in spirit, under another name:
// linked into Cilium's agent, Cilium's "node-addresses" table is in the
// same database, with other rows (the addresses Cilium's datapath uses).
package nodeips
