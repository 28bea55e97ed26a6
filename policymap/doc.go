// Package policymap is what the BPF map features share: each keeps LPM maps
// equal to a statedb table, one map entry per statedb object, through
// statedb's reconciler and the generic LPM operations of package bpf.
//
// Every entry has its own status and retry, so that a key the kernel refuses
// stops neither the other updates nor the deletion of stale keys; keys are
// built only from prefixes of the map's family, and entries of a family the
// node does not run are skipped and shown as such, never encoded.
//
// The features live in packages of their own, composed by [Module]:
// masqmap (Cilium's masquerade exemption maps cilium_ipmasq_v4/_v6, from
// ip-masq-agent-cidrs) and netpolicy (the per-pod network-policy maps, from
// PolicyEndpoint objects). This package holds one copy of what they share:
// the retry and refresh flags ([Config]), the maps of a table with their
// pins, fault injector and metrics ([Maps]), the reconciler with its
// batched refresh ([RegisterReconciler]), the kernel listing ([ListPrefixes]) and the script commands that wait for the
// kernel or inject faults.
package policymap
