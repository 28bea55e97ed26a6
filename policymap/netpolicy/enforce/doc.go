// Package enforce puts the policy programs (bpf/c/policy.c) on the pods'
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
// The programs keep the connections the policy allowed in a pinned
// connection-tracking map, so that replies pass and a restart keeps them.
package enforce
