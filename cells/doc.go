// Package cells composes the enimasq agent from Hive cells.
//
// Infrastructure provides what feature cells expect from the agent they are
// linked into: a statedb, a job registry with a private job.Group and a health
// scope per module, reconciler metrics, the hive shell and an HTTP API on a
// unix socket. Node-wide settings (IP families, bpf root, state dir) become a
// nodeconfig.Config. Agent is Infrastructure plus the feature cells.
//
// The split exists so that a Cilium-based agent can link the feature cells
// (ipmasq.Cell, policymap.Cell, ipam.Cell) into its own hive, providing
// nodeconfig.Config itself, without this package.
package cells
