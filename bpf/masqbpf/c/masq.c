// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// The masquerade decision of Cilium's datapath with the ip-masq-agent: look
// the destination up in the family's non-masquerade LPM map; a hit means the
// packet keeps its source address (no SNAT).
//
// The program is a decision probe run with BPF_PROG_TEST_RUN (tests and
// `enimasq-dbg`), not attached to a device: it returns the decision.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MASQ_NO_SNAT 0 /* destination is a non-masquerade CIDR */
#define MASQ_SNAT 1    /* masquerade */
#define MASQ_PASS 2    /* not IPv4 or IPv6, or a truncated packet */

struct lpm_v4_key {
	__u32 prefixlen;
	__u8 addr[4];
};

struct lpm_v6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lpm_v4_key);
	__type(value, __u8);
	__uint(max_entries, 16384);
	/* Cilium's flags (pkg/maps/ipmasq): the datapath only reads it. */
	__uint(map_flags, BPF_F_NO_PREALLOC | BPF_F_RDONLY_PROG);
} cilium_ipmasq_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lpm_v6_key);
	__type(value, __u8);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC | BPF_F_RDONLY_PROG);
} cilium_ipmasq_v6 SEC(".maps");

SEC("tc")
int masq_decision(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return MASQ_PASS;

	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip4 = (void *)(eth + 1);
		struct lpm_v4_key key = { .prefixlen = 32 };

		if ((void *)(ip4 + 1) > data_end)
			return MASQ_PASS;
		__builtin_memcpy(key.addr, &ip4->daddr, sizeof(key.addr));
		return bpf_map_lookup_elem(&cilium_ipmasq_v4, &key) ? MASQ_NO_SNAT : MASQ_SNAT;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		struct lpm_v6_key key = { .prefixlen = 128 };

		if ((void *)(ip6 + 1) > data_end)
			return MASQ_PASS;
		__builtin_memcpy(key.addr, &ip6->daddr, sizeof(key.addr));
		return bpf_map_lookup_elem(&cilium_ipmasq_v6, &key) ? MASQ_NO_SNAT : MASQ_SNAT;
	}
	return MASQ_PASS;
}

char __license[] SEC("license") = "Dual BSD/GPL";
