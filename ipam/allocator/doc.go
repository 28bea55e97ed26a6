// Package allocator is enimasq's own allocator, the writer of
// ipam-allocations in the standalone agent: it hands out pod IPs from the
// pools of the enis table, checkpoints every change in the state dir before
// it is answered (checkpoint.go, restore.go), serves the CNI API
// (/v1/ipam: api.go), and with the API server reports its allocations in
// the CiliumNode's status.ipam.used (status_k8s.go). A CNI ADD waits for
// the pod's rules through Programmed, which the datapath provides.
package allocator
