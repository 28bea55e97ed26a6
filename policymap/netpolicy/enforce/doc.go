// Package enforce puts the policy programs (bpf/policybpf/c/policy.c) on the pods'
// devices, so that the policy maps decide real packets: policy_egress on the
// ingress of a pod's host-side device (what the pod sends), policy_ingress
// on its egress (what it receives). A pod's device is the one the node's
// route to the pod IP leaves by, a veth: enimasq-cni's and the AWS VPC CNI's
// (eni*) alike.
//
// The attachments are rows of the policy-attachments table, one per device,
// derived from the pods the PolicyEndpoints select (every pod device in
// strict mode) and the node's routes and links, and reconciled with per-row
// status and retry. They are tcx links pinned in bpffs where the kernel has
// tcx (6.6), so a restarted agent finds them enforcing and replaces the
// program in place; tc (clsact) filters otherwise. A device that comes back
// is attached again from the link notifications, and a program detached by
// hand is put back at the next check (the kernel sends no notification
// for it). Pruning removes only enimasq's pins and filters.
//
// The tcx links (tcx.go) are attached at the head of the chain and held
// open by the agent, by device and side: a deleted pin, or a bpffs mounted
// again, detaches nothing, and the check pins them again. The check also
// asks the kernel for the chain: a foreign program ahead of enimasq's is an
// error naming it while it stays attached, enimasq's is put back first (the
// foreign one is left where it is) and the device's tracked connections
// are forgotten. Another writer's program anywhere on the hooks (a tcx
// program behind enimasq's, a tc filter: the AWS network policy agent's
// on eni* devices) is never touched either, and makes the row an error
// naming it while it stays (foreign.go says why an error).
//
// Uninstall (enimasq-dbg cleanup) takes every program of enimasq off the
// devices with no agent running.
//
// The programs keep the connections the policy allowed in a pinned
// connection-tracking map, so that replies pass and a restart keeps them.
package enforce
