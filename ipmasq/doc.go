// Package ipmasq turns the ip-masq-agent configuration file into the statedb
// table ip-masq-agent-cidrs: one row per non-masquerade CIDR in effect.
//
// It is compatible with Cilium's ip-masq-agent (same flags, file format,
// defaults and link-local handling) and fixes what goes wrong there: the
// CIDRs live in a table that consumers (the policy-map cell, the ENI IPAM
// allocator) watch instead of a racy getter; a bad file never removes the
// CIDRs in force and shows in module health until a good file arrives; the
// config directory may be missing at start (Cilium exits); a zero-byte file
// gives the defaults of a missing one, as in Cilium; a file rewritten
// in place is applied once it has been stable for SettleTime, never in its
// half-written states, while renames and ConfigMap ..data swaps are applied
// at once (cells/filewatch, on inotify); and the file is re-read
// periodically in case a filesystem event was missed.
//
// Changes are applied as a diff: a row that did not change keeps its
// revision, so downstream reconcilers do no work for it.
package ipmasq
