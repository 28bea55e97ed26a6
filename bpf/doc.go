// Package bpf holds the user-space side of enimasq's BPF LPM-trie maps: the
// key layout, the map specs and pinning, and generic statedb reconciler
// operations that keep a map in step with a table.
//
// # Keys and entries
//
// A key must never be built from a prefix of the other family (a v6 prefix
// sized as a v4 key is EINVAL, or worse a valid-looking v4 key), and one
// entry the kernel refuses must never stop the others or the deletion of
// stale ones (the AWS network policy agent's failures: network-policy.md,
// "How this differs from the AWS agent"). Both hold by construction:
//
//   - A key can only be built from a prefix of the key's own family.
//     [NewKeyV4] refuses an IPv6 prefix (including an IPv4-mapped ::ffff:a.b.c.d
//     prefix, which is IPv6 as written and is never unmapped silently) and
//     [NewKeyV6] refuses an IPv4 prefix, before anything reaches the kernel.
//     [EncodePrefix] picks the key type from the prefix itself.
//   - Every map entry is its own statedb object with its own reconciler
//     status and its own retry. [Ops] implements the reconciler's single and
//     batch operations so that an entry the kernel refuses gets that error as
//     its own result while every other entry of the batch is still applied,
//     and [Ops.Prune] deletes stale keys whatever happened to the updates.
//
// Map layout (Cilium's cilium_ipmasq_v4 / cilium_ipmasq_v6): an LPM trie with
// BPF_F_NO_PREALLOC, key {u32 prefixlen (host order); u8 addr[4|16] (network
// order)}, value u8. See [IPMasqV4Spec] and [OpenPinned].
package bpf
