// Package datapath is the kernel part of ipam: from enis, ipam-allocations
// and ip-masq-agent-cidrs it derives the eni-rules and eni-routes tables
// (rules.go, desired.go) and reconciles them with netlink (ops.go,
// routeops.go), repairing what someone else changes from the kernel tables
// of cells/kernel (kernel-rules, kernel-routes, kernel-links:
// kernelevents.go), with no subscription of its own. Programmed (wait.go) is the wait a CNI
// ADD needs, read from the rows by index.
//
// Settings say what of a pod's datapath is enimasq's to write: the ingress
// rule and the ENI routes (the standalone agent), or only the egress rules
// in the CNI's shape and protocol (the Cilium build). Rules and routes of
// enimasq's own protocol (RTProto) are pruned; those of another writer are
// never touched.
package datapath
