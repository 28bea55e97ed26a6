// Package infra is what every enimasq feature cell expects from the agent it
// is linked into, for the standalone agent: a statedb, a job registry with a
// private job.Group and a health scope per module, reconciler metrics, the
// hive shell, an HTTP API on a unix socket, and the node-wide flags that
// become a nodeconfig.Config (IP families, masquerading, ip-masq-agent, IPAM
// mode, bpf root, state dir), with the claim on the node (agent lock, bpffs).
//
// It imports no feature package. A Cilium-based agent has all of this itself
// (Cilium's hive gives statedb, jobs, health and the shell) and links the
// feature cells (enimasq.Features) without this package, providing
// nodeconfig.Config from its own configuration.
package infra
