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
// are a statedb table (eni-rules) derived from the allocations, the ENIs
// and the ip-masq-agent-cidrs table, and reconciled by statedb's
// reconciler: they always follow the config, a change touches only the
// rules it changes, every rule has its own status and retry, and drift is
// repaired by the periodic refresh.
//
// Tables: enis (from the CiliumNode file, or with the Kubernetes API server
// from the CiliumNode named after the node: source_k8s.go, same parser),
// ipam-allocations (the allocator, checkpointed in the state dir and, with
// the API server, reported in the CiliumNode's status.ipam.used:
// status_k8s.go; or, linked into an agent whose own IPAM allocates, the
// IPs that agent lists: external.go), eni-rules and eni-routes (desired
// state, reconciled). Rules and routes carry the netlink protocol RTProto; pruning
// removes only those, never the rules of aws-node, Cilium or an operator.
//
// Tests: the script tests in testdata run twice, on a netlinkfake.Netlink
// (package ipam/netlinkfake, for tests only: the kernel's rule, route, link
// and notification semantics that the reconcilers rely on, in memory; no
// root needed) and,
// as root, on a fresh network namespace; the fake is held against the
// kernel by TestPrivilegedFakeNetlinkMatchesKernel.
//
// Documentation/eni-ipam.md describes the allocation result, the rules and
// routes, the two egress modes and how to debug a pod's egress path.
package ipam
