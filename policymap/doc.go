// Package policymap keeps BPF LPM maps equal to statedb tables, one map entry
// per statedb object, through statedb's reconciler and the generic LPM
// operations of package bpf.
//
// It exists because the AWS network policy agent refreshed a pod's map in one
// bulk operation that stopped at the first key the kernel refused (a v6 except
// encoded as a v4 key), so neither the remaining updates nor the deletion of
// stale keys ever ran again. Here every entry has its own status and retry,
// keys are built only from prefixes of the map's family, and entries of a
// family the node does not run are skipped and shown as such, never encoded.
//
// The first maps are Cilium's masquerade exemption maps, cilium_ipmasq_v4 and
// cilium_ipmasq_v6, derived from the ip-masq-agent-cidrs table.
//
// With --enable-network-policy, the cell also reads PolicyEndpoint objects
// (networking.k8s.aws/v1alpha1) from a directory, or with the Kubernetes API
// server from all namespaces (the pods of this node only), into the
// policy-endpoints
// table, compiles them per pod IP and direction into the policy-map-entries
// table (see CompilePod for the semantics and the encoding) and reconciles
// that into the per-pod network-policy maps enimasq_egress_v4/_v6 and
// enimasq_ingress_v4/_v6, which the verdict program in package bpf reads.
// Files: policy_config.go (flags), policyendpoint*.go (objects, parser),
// policy_source.go (directory watcher), policy_source_k8s.go (API server
// informer and the node rule), policy_compile.go (compiler),
// policy_table.go (entries), policy_derive.go (the job that recompiles only
// what changed), policy.go (registration), policy_script.go and
// policy_dump.go (script commands, kernel listing, verdicts).
package policymap
