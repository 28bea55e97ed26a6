// Package netpolicy enforces network policy for the pods of this node in
// per-pod BPF LPM maps and the policy programs on the pods' devices. It
// runs with --enable-network-policy and composes its parts, which meet only
// through tables, as ipam's do:
//
//	endpoints  the policy-endpoints table: one row per PolicyEndpoint object
//	           in force (networking.k8s.aws/v1alpha1, as the AWS network
//	           policy controller writes them)
//	source     a directory of PolicyEndpoint files, or the API server in all
//	           namespaces (the pods of this node only) -> policy-endpoints;
//	           decoding, validation, and failing closed on what is not valid
//	compile    policy-endpoints -> policy-map-entries (see compile.CompilePod
//	           for the semantics and the encoding), reconciled into the maps
//	           enimasq_egress_v4/_v6 and enimasq_ingress_v4/_v6
//	enforce    the pod IPs of policy-endpoints -> policy-attachments and
//	           policy-bindings: the programs on the pods' devices, which read
//	           the maps
//
// A part imports no other part, only the table package endpoints
// (layout_test.go holds it). Package inspect reads the kernel's policy maps
// back and judges a packet on them (the script commands and enimasq-dbg).
//
// Files: cell.go (the composition), config.go (flags, their validation and
// the parts' settings), enforcing.go (what enforce gets from the others: the
// selected pods, the kernel maps), script.go (the policy maps' script
// commands). The script tests in testdata run the composed cell, on fake
// maps and, as root, on kernel maps; testdata/k8s against an API server.
//
// Every entry is a row of its own, with its own status and retry (package
// policymap).
package netpolicy
