// Package ipam is the AWS ENI IPAM of enimasq, compatible with Cilium's ENI
// mode: it hands out pod IPs from the node's ENIs as the CiliumNode object
// describes them, returns the CIDRs each pod reaches directly (the VPC
// CIDRs, --ipv4-native-routing-cidr and the non-masquerade CIDRs of the
// ip-masq-agent), and keeps the per-pod ip rules and per-ENI routes in the
// kernel with netlink.
//
// Cilium (#35501, fixed by #40141) writes a pod's rules once, at pod
// creation: a later ip-masq-agent change leaves running pods with stale
// rules, and traffic to a peered VPC leaves by the wrong ENI. Here the rules
// are a statedb table derived from the allocations, the ENIs and the
// ip-masq-agent-cidrs table, and reconciled by statedb's reconciler: they
// always follow the config, a change touches only the rules it changes,
// every rule has its own status and retry, and drift is repaired from
// kernel events.
//
// The parts meet only through tables, as Cilium's load-balancer writer,
// reflectors and reconciler do:
//
//	ciliumnode   the CiliumNode (file, or the API server) -> enis
//	allocations  the ipam-allocations table, written by one of:
//	  allocator  enimasq's allocator, its CNI API and checkpoint (standalone), or
//	  podset     the embedding agent's pod set (the Cilium build's ciliumlink)
//	datapath     enis + ipam-allocations + ip-masq-agent-cidrs -> eni-rules,
//	             eni-routes -> ip rules and routes; the wait of a CNI ADD
//
// This package composes them (Cell) and alone decides, from who allocates
// (nodeconfig.IPAM.Allocator), which writer runs and what of a pod's
// datapath is enimasq's (NewSettings). Rules and routes of enimasq's own
// carry the netlink protocol datapath.RTProto; pruning never touches the
// rules of aws-node, Cilium or an operator.
//
// Tests: the script tests in testdata run the composed cell twice, on a
// netlinkfake.Netlink (package ipam/netlinkfake, for tests only: it is
// also the kernel.Source that cells/kernel keeps its tables from) and, as
// root, on a fresh network namespace; the fake is held against the kernel by
// TestPrivilegedFakeNetlinkMatchesKernel.
//
// Documentation/eni-ipam.md describes the allocation result, the rules and
// routes, the two egress modes and how to debug a pod's egress path.
package ipam
