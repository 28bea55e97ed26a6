// Package netpolicy enforces network policy for the pods of this node in
// per-pod BPF LPM maps: it reads PolicyEndpoint objects
// (networking.k8s.aws/v1alpha1, as the AWS network policy controller writes
// them) from a directory, or from the API server in all namespaces (the
// pods of this node only), into the policy-endpoints table, compiles them per
// pod IP and direction into the policy-map-entries table (see CompilePod for
// the semantics and the encoding) and reconciles that into the maps
// enimasq_egress_v4/_v6 and enimasq_ingress_v4/_v6, which the verdict program
// in package bpf reads. It runs with --enable-network-policy.
//
// Every entry is a row of its own, with its own status and retry (package
// policymap).
//
// Files: cell.go (the cell and its registration), config.go (flags),
// endpoint.go (objects and their table), parse.go and documents.go (the file
// format, decoded by cells/strictdecode), source.go (directory watcher),
// source_k8s.go (API server informer and the node rule), compile.go,
// sweep.go and values.go (compiler), table.go (policy-map-entries),
// derive.go (the job that recompiles only what changed), metrics.go,
// script.go and dump.go (script commands, kernel listing, verdicts).
package netpolicy
