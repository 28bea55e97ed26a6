// Package bpf holds the user-space side of enimasq's BPF LPM-trie maps: the
// key layout, the map specs and pinning, and generic statedb reconciler
// operations that keep a map in step with a table.
//
// # Why it exists
//
// The AWS VPC CNI network policy agent built malformed LPM keys and then let
// one bad key freeze a whole map. On an IPv4-only cluster an `except` of
// 100::/64 became a key with prefix length 64 and four data bytes
// (40 00 00 00 01 00 00 00): the keys were sized by the cluster's family, not
// by the address's. The kernel answered EINVAL, and because the bulk refresh
// returned at the first failed update, the deletion of stale keys that was to
// follow never ran: entries for recycled pod IPs stayed in the map. Worse,
// fe80::/10 became the valid-looking IPv4 key 254.128.0.0/10 and was installed
// silently.
//
// This package makes both failures impossible by construction:
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
