// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// The network-policy verdict of a packet against enimasq's per-pod policy
// maps (enimasq_egress_v4/_v6, enimasq_ingress_v4/_v6).
//
// One LPM lookup answers "may this pod talk to that peer": the key is the
// pod's address followed by the peer's, with prefix length = pod bits + peer
// bits, so a lookup with the full length returns the pod's longest matching
// peer prefix. The value lists up to 24 {protocol, start_port, end_port}
// entries; an entry list with no allow entries denies.
//
// policy_egress treats the packet's source as the pod and its destination as
// the peer; policy_ingress the other way round. Both match the destination
// port. They return TC_ACT_UNSPEC (allow: the next program or filter of
// the device runs, as tcx's TCX_NEXT) or TC_ACT_SHOT (deny) and leave the
// reason in skb->cb[0] and the index of the deciding port entry in
// skb->cb[1] (BPF_PROG_TEST_RUN hands cb back, which is how tests and
// enimasq-dbg explain a verdict).
//
// They are stateful, as NetworkPolicy is: a packet the policy allows opens
// a connection in enimasq_policy_ct (TCP and UDP by ports, ICMP echo by its
// identifier), keyed by pod and peer so that both directions find it, and
// every packet of a tracked connection passes, either way, until it has
// been idle for the protocol's timeout (a TCP RST closes it at once). The
// map is an LRU hash: bounded, the least recently used connection goes
// first. enimasq_policy_mode[0] is the enforcing mode: in strict mode a pod
// that no policy selects is denied instead of allowed.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define POLICY_MAX_PORT_ENTRIES 24
#define POLICY_PROTO_ANY 254
#define POLICY_MAX_ENTRIES 65536

/* Reasons, in skb->cb[0]. */
#define REASON_ALLOWED 1   /* a port entry of the pod's longest matching key allows */
#define REASON_DENIED 2    /* the pod's longest matching key lists nothing that allows */
#define REASON_NO_POLICY 3 /* the pod has no key: no PolicyEndpoint selects it */
#define REASON_NOT_IP 4    /* not IPv4 or IPv6, or a truncated IP header: passed */
#define REASON_TRACKED 5   /* a packet of a connection the policy allowed */
#define REASON_STRICT 6    /* no policy selects the pod, and the mode is strict */
#define REASON_NEIGHBOR 7  /* IPv6 router and neighbour discovery: passed */
#define REASON_SPOOFED 8   /* the source is not a pod of the device it came from */

/* BPF_PROG_TEST_RUN runs a packet as if on the loopback device: the device
 * check does not apply there (the programs are never on lo). */
#define LOOPBACK_IFINDEX 1

/* An allowed packet goes on to whatever else runs on the device. */
#define VERDICT_PASS TC_ACT_UNSPEC

#define MODE_STRICT 1

#define CT_MAX_ENTRIES 65536
#define NSEC 1000000000ULL
#define CT_TIMEOUT_TCP (3600 * NSEC)
#define CT_TIMEOUT_UDP (60 * NSEC)
#define CT_TIMEOUT_ICMP (30 * NSEC)

#define NO_PORT_ENTRY 0xffffffff

struct policy_v4_key {
	__u32 prefixlen;
	__u8 pod[4];
	__u8 peer[4];
};

struct policy_v6_key {
	__u32 prefixlen;
	__u8 pod[16];
	__u8 peer[16];
};

struct port_entry {
	__u32 protocol;   /* IP protocol number, POLICY_PROTO_ANY = any */
	__u32 start_port; /* 0 = any port */
	__u32 end_port;   /* 0 = start_port only */
};

struct policy_value {
	struct port_entry entries[POLICY_MAX_PORT_ENTRIES];
};

#define POLICY_MAP(_name, _key)                              \
	struct {                                             \
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);         \
		__type(key, _key);                           \
		__type(value, struct policy_value);          \
		__uint(max_entries, POLICY_MAX_ENTRIES);     \
		__uint(map_flags, BPF_F_NO_PREALLOC);        \
	} _name SEC(".maps")

POLICY_MAP(enimasq_egress_v4, struct policy_v4_key);
POLICY_MAP(enimasq_egress_v6, struct policy_v6_key);
POLICY_MAP(enimasq_ingress_v4, struct policy_v4_key);
POLICY_MAP(enimasq_ingress_v6, struct policy_v6_key);

/* A tracked connection: the pod's and the peer's addresses (IPv4 in the
 * first 4 bytes) and ports (the echo identifier twice for ICMP), seen from
 * the pod whichever way the packet goes. */
struct ct_key {
	__u8 pod[16];
	__u8 peer[16];
	__u16 pod_port;
	__u16 peer_port;
	__u8 protocol;
	__u8 family;
	__u8 pad[2];
};

struct ct_value {
	__u64 last_seen; /* bpf_ktime_get_ns */
	__u32 opened_by; /* 1: the pod's egress, 2: its ingress */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(max_entries, CT_MAX_ENTRIES);
} enimasq_policy_ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} enimasq_policy_mode SEC(".maps");

/* The pods of each device the programs are on: pod address (IPv4 in the
 * first 4 bytes) -> the ifindex of its host-side device. What a pod sends
 * must come from its own device, so that no pod is judged as another by a
 * forged source address. */
struct pod_key {
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct pod_key);
	__type(value, __u32);
	__uint(max_entries, 65536);
} enimasq_policy_pods SEC(".maps");

/* from_its_device says whether the pod address a packet leaving a pod
 * claims is one of the pods of the device it came from. */
static __always_inline int from_its_device(struct __sk_buff *skb, const void *addr, int len, __u8 family)
{
	struct pod_key k = { .family = family };
	__u32 *ifindex;

	if (skb->ifindex == LOOPBACK_IFINDEX)
		return 1;
	__builtin_memcpy(k.addr, addr, len);
	ifindex = bpf_map_lookup_elem(&enimasq_policy_pods, &k);
	return ifindex && *ifindex == skb->ifindex;
}

/* The fields of a packet that the policy looks at. */
struct flow {
	__u32 protocol;
	__u32 port;       /* destination port */
	__u32 sport;      /* source port */
	__u8 port_known;  /* false for ICMP, non-first fragments, other protocols */
	__u8 echo;        /* 1: an ICMP echo request, 2: an echo reply (id in sport) */
	__u8 rst;         /* a TCP RST */
};

static __always_inline int has_ports(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

/* read_dport reads the destination port of a TCP, UDP or SCTP header at l4:
 * all three have the source port then the destination port first. */
static __always_inline void read_dport(struct flow *f, void *l4, void *data_end)
{
	__be16 *ports = l4;
	__u8 *b = l4;

	if ((f->protocol == IPPROTO_ICMP || f->protocol == IPPROTO_ICMPV6) && (void *)(b + 6) <= data_end) {
		/* type, code, checksum, identifier */
		if (b[0] == 8 || b[0] == 128)
			f->echo = 1;
		else if (b[0] == 0 || b[0] == 129)
			f->echo = 2;
		f->sport = bpf_ntohs(*(__be16 *)(b + 4));
		return;
	}
	if (!has_ports(f->protocol) || (void *)(ports + 2) > data_end)
		return;
	f->sport = bpf_ntohs(ports[0]);
	f->port = bpf_ntohs(ports[1]);
	f->port_known = 1;
	if (f->protocol == IPPROTO_TCP && (void *)(b + 14) <= data_end)
		f->rst = (b[13] & 0x04) != 0;
}

static __always_inline int port_entry_allows(const struct port_entry *e, const struct flow *f)
{
	if (e->protocol != POLICY_PROTO_ANY && e->protocol != f->protocol)
		return 0;
	if (e->start_port == 0)
		return 1;
	if (!f->port_known)
		return 0;
	if (e->end_port == 0)
		return f->port == e->start_port;
	return f->port >= e->start_port && f->port <= e->end_port;
}

static __always_inline __u64 ct_timeout(__u8 proto)
{
	if (proto == IPPROTO_TCP)
		return CT_TIMEOUT_TCP;
	if (proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6)
		return CT_TIMEOUT_ICMP;
	return CT_TIMEOUT_UDP;
}

/* ct_key_of fills the connection key of the packet seen from the pod. */
static __always_inline void ct_key_of(struct ct_key *k, const struct flow *f, int egress)
{
	k->protocol = f->protocol;
	if (f->echo) {
		k->pod_port = f->sport;
		k->peer_port = f->sport;
	} else if (f->port_known) {
		k->pod_port = egress ? f->sport : f->port;
		k->peer_port = egress ? f->port : f->sport;
	}
}

/* tracked says whether the packet belongs to a live tracked connection,
 * and keeps it alive (or closes it on a TCP RST). */
static __always_inline int tracked(struct ct_key *k, const struct flow *f)
{
	struct ct_value *v;
	__u64 now;

	if (!f->port_known && !f->echo)
		return 0;
	v = bpf_map_lookup_elem(&enimasq_policy_ct, k);
	if (!v)
		return 0;
	now = bpf_ktime_get_ns();
	if (now - v->last_seen > ct_timeout(k->protocol)) {
		bpf_map_delete_elem(&enimasq_policy_ct, k);
		return 0;
	}
	if (f->rst)
		bpf_map_delete_elem(&enimasq_policy_ct, k);
	else
		v->last_seen = now;
	return 1;
}

/* track opens a connection the policy allowed: TCP and UDP, ICMP echo
 * requests. */
static __always_inline void track(struct ct_key *k, const struct flow *f, int egress)
{
	struct ct_value v = { .opened_by = egress ? 1 : 2 };

	if ((!f->port_known && f->echo != 1) || f->rst)
		return;
	v.last_seen = bpf_ktime_get_ns();
	bpf_map_update_elem(&enimasq_policy_ct, k, &v, BPF_ANY);
}

static __always_inline int strict_mode(void)
{
	__u32 zero = 0;
	__u32 *mode = bpf_map_lookup_elem(&enimasq_policy_mode, &zero);

	return mode && *mode == MODE_STRICT;
}

static __always_inline int decide(struct __sk_buff *skb, const struct policy_value *v, const struct flow *f)
{
	if (!v) {
		if (strict_mode()) {
			skb->cb[0] = REASON_STRICT;
			return TC_ACT_SHOT;
		}
		skb->cb[0] = REASON_NO_POLICY;
		return VERDICT_PASS;
	}
	for (__u32 i = 0; i < POLICY_MAX_PORT_ENTRIES; i++) {
		const struct port_entry *e = &v->entries[i];

		if (e->protocol == 0)
			break; /* unused slots are zero and come last */
		if (port_entry_allows(e, f)) {
			skb->cb[0] = REASON_ALLOWED;
			skb->cb[1] = i;
			return VERDICT_PASS;
		}
	}
	skb->cb[0] = REASON_DENIED;
	return TC_ACT_SHOT;
}

/* icmp_related says whether an ICMP error (destination unreachable, packet
 * too big, time exceeded, parameter problem) is about a live tracked
 * connection of the pod: the header it quotes, at l4 + 8, is a packet of
 * that connection, sent by the pod (on its ingress) or to it (on its
 * egress). Only quotes with a plain header (IPv4 without options, IPv6
 * without extension headers) are read. */
static __always_inline int icmp_related(void *l4, void *data_end, int egress, int v6)
{
	__u8 *icmp = l4;
	struct ct_key k = {};
	struct ct_value *v;
	__u8 *ports;

	if ((void *)(icmp + 8) > data_end)
		return 0;
	if (v6) {
		struct ipv6hdr *in = (void *)(icmp + 8);

		if (icmp[0] < 1 || icmp[0] > 4 || (void *)(in + 1) > data_end)
			return 0;
		k.family = 6;
		k.protocol = in->nexthdr;
		__builtin_memcpy(k.pod, egress ? &in->daddr : &in->saddr, 16);
		__builtin_memcpy(k.peer, egress ? &in->saddr : &in->daddr, 16);
		ports = (void *)(in + 1);
	} else {
		struct iphdr *in = (void *)(icmp + 8);

		if ((icmp[0] != 3 && icmp[0] != 11 && icmp[0] != 12) || (void *)(in + 1) > data_end || in->ihl != 5)
			return 0;
		k.family = 4;
		k.protocol = in->protocol;
		__builtin_memcpy(k.pod, egress ? &in->daddr : &in->saddr, 4);
		__builtin_memcpy(k.peer, egress ? &in->saddr : &in->daddr, 4);
		ports = (void *)(in + 1);
	}
	if ((void *)(ports + 8) > data_end)
		return 0;
	if (k.protocol == IPPROTO_ICMP || k.protocol == IPPROTO_ICMPV6) {
		k.pod_port = bpf_ntohs(*(__be16 *)(ports + 4)); /* the echo's identifier */
		k.peer_port = k.pod_port;
	} else if (has_ports(k.protocol)) {
		__u16 sport = bpf_ntohs(*(__be16 *)ports), dport = bpf_ntohs(*(__be16 *)(ports + 2));

		/* The quoted packet went the other way. */
		k.pod_port = egress ? dport : sport;
		k.peer_port = egress ? sport : dport;
	} else {
		return 0;
	}
	v = bpf_map_lookup_elem(&enimasq_policy_ct, &k);
	return v && bpf_ktime_get_ns() - v->last_seen <= ct_timeout(k.protocol);
}

/* decide_tracked passes the packets of tracked connections, decides the
 * others by the policy, and tracks what the policy allows. */
static __always_inline int decide_tracked(struct __sk_buff *skb, const struct policy_value *v, const struct flow *f,
					  struct ct_key *ct, int egress)
{
	int ret;

	ct_key_of(ct, f, egress);
	if (tracked(ct, f)) {
		skb->cb[0] = REASON_TRACKED;
		return VERDICT_PASS;
	}
	ret = decide(skb, v, f);
	if (ret == VERDICT_PASS && skb->cb[0] == REASON_ALLOWED)
		track(ct, f, egress);
	return ret;
}

static __always_inline int verdict(struct __sk_buff *skb, int egress)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct flow f = {};
	struct ct_key ct = {};

	skb->cb[0] = REASON_NOT_IP;
	skb->cb[1] = NO_PORT_ENTRY;
	if ((void *)(eth + 1) > data_end)
		return VERDICT_PASS;

	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip4 = (void *)(eth + 1);
		struct policy_v4_key key = { .prefixlen = 64 };

		if ((void *)(ip4 + 1) > data_end || ip4->ihl < 5)
			return VERDICT_PASS;
		f.protocol = ip4->protocol;
		/* Only the first fragment carries the ports. */
		if ((ip4->frag_off & bpf_htons(0x1fff)) == 0)
			read_dport(&f, (void *)ip4 + ip4->ihl * 4, data_end);
		if (egress && !from_its_device(skb, &ip4->saddr, 4, 4)) {
			skb->cb[0] = REASON_SPOOFED;
			return TC_ACT_SHOT;
		}
		__builtin_memcpy(key.pod, egress ? &ip4->saddr : &ip4->daddr, 4);
		__builtin_memcpy(key.peer, egress ? &ip4->daddr : &ip4->saddr, 4);
		__builtin_memcpy(ct.pod, key.pod, 4);
		__builtin_memcpy(ct.peer, key.peer, 4);
		ct.family = 4;
		if (f.protocol == IPPROTO_ICMP && !f.echo && icmp_related((void *)ip4 + ip4->ihl * 4, data_end, egress, 0)) {
			skb->cb[0] = REASON_TRACKED;
			return VERDICT_PASS;
		}
		return decide_tracked(skb, bpf_map_lookup_elem(egress ? (void *)&enimasq_egress_v4 : (void *)&enimasq_ingress_v4, &key), &f, &ct, egress);
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		struct policy_v6_key key = { .prefixlen = 256 };

		if ((void *)(ip6 + 1) > data_end)
			return VERDICT_PASS;
		if (ip6->nexthdr == IPPROTO_ICMPV6) {
			__u8 *type = (void *)(ip6 + 1);

			/* Router solicitation and advertisement, neighbour
			 * solicitation and advertisement, redirect: what IPv6
			 * needs to work at all, from link-local addresses no
			 * policy names. */
			if ((void *)(type + 1) <= data_end && *type >= 133 && *type <= 137) {
				skb->cb[0] = REASON_NEIGHBOR;
				return VERDICT_PASS;
			}
		}
		if (egress && !from_its_device(skb, &ip6->saddr, 16, 6)) {
			skb->cb[0] = REASON_SPOOFED;
			return TC_ACT_SHOT;
		}
		/* Extension headers are not walked: behind one, the port is
		 * unknown and only any-port entries match. */
		f.protocol = ip6->nexthdr;
		read_dport(&f, ip6 + 1, data_end);
		__builtin_memcpy(key.pod, egress ? &ip6->saddr : &ip6->daddr, 16);
		__builtin_memcpy(key.peer, egress ? &ip6->daddr : &ip6->saddr, 16);
		__builtin_memcpy(ct.pod, key.pod, 16);
		__builtin_memcpy(ct.peer, key.peer, 16);
		ct.family = 6;
		if (f.protocol == IPPROTO_ICMPV6 && !f.echo && icmp_related(ip6 + 1, data_end, egress, 1)) {
			skb->cb[0] = REASON_TRACKED;
			return VERDICT_PASS;
		}
		return decide_tracked(skb, bpf_map_lookup_elem(egress ? (void *)&enimasq_egress_v6 : (void *)&enimasq_ingress_v6, &key), &f, &ct, egress);
	}
	return VERDICT_PASS;
}

SEC("tc")
int policy_egress(struct __sk_buff *skb)
{
	return verdict(skb, 1);
}

SEC("tc")
int policy_ingress(struct __sk_buff *skb)
{
	return verdict(skb, 0);
}

char __license[] SEC("license") = "Dual BSD/GPL";
