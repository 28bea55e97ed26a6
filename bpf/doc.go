// Package bpf holds what enimasq's BPF maps share whatever program reads
// them: the LPM-trie key layout, the map specs and pinning, the map store,
// and the generic statedb reconciler operations that keep maps in step
// with a table (single and batch updates, prune, spill maps, fault
// injection, observation).
//
// It knows no program. A program and the ABI of its maps change together,
// so each has a package of its own under bpf/ that imports this one, never
// the reverse (layout_bpf_test.go holds it):
//
//   - [github.com/enimasq/enimasq/bpf/policybpf]: the network policy
//     programs (c/policy.c), their maps' specs and values, the connection
//     table, the events and counters, the pods' policy versions;
//   - [github.com/enimasq/enimasq/bpf/masqbpf]: masq_decision (c/masq.c),
//     the test program of the ipmasq maps.
//
// The ipmasq maps (cilium_ipmasq_v4/v6) are specified here: they are plain
// LPM tries of this package's keys, Cilium's program reads them, and this
// package's tests use them as their maps. The keys of the policy maps are
// here too (podkeys.go): the operations describe the keys they fail on,
// and a key of either kind is built from addresses of one family only.
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
