// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// The network-policy verdict of a packet against enimasq's per-pod policy
// maps: the NetworkPolicy maps (enimasq_egress_v4/_v6,
// enimasq_ingress_v4/_v6, from PolicyEndpoints) and the cluster maps
// (enimasq_cluster_egress_v4/_v6, enimasq_cluster_ingress_v4/_v6, from
// ClusterPolicyEndpoints).
//
// One LPM lookup per map answers "what may this pod do with that peer":
// the key is the pod's address, the version of its policy in force
// (enimasq_policy_versions), then the peer's address, with prefix length
// = pod bits + 32 + peer bits, so a lookup with the full length returns the
// pod's longest matching peer prefix in that version. The value is a list of disjoint
// intervals over (protocol << 16 | destination port), sorted, each with
// what it decides: the first POLICY_INLINE in the value, the others in
// chunks of POLICY_CHUNK in a hash map (enimasq_policy_chunks,
// enimasq_cluster_chunks) under the value's list id, so a rule may list any
// number of ports. A lookup is a binary search: its cost grows with the
// logarithm of the count.
//
// The order is the AWS network policy agent's (v1.5.0, tc.v4egress.bpf.c
// evaluateFlow): the Admin tier of the cluster maps (compiled in user space
// so that each interval holds the winning Admin action: the lowest priority
// number, at a tie Deny over Accept over Pass; Pass hands over), then the
// NetworkPolicy (a pod isolated in the direction is denied what its
// intervals do not allow), then the Baseline tier (only where no
// NetworkPolicy isolates the pod in the direction), then the default (allow;
// deny in strict mode).
//
// policy_egress treats the packet's source as the pod and its destination as
// the peer; policy_ingress the other way round. Both match the destination
// port. They return TC_ACT_UNSPEC (allow: the next program or filter of
// the device runs, as tcx's TCX_NEXT) or TC_ACT_SHOT (deny) and leave the
// reason in skb->cb[0], the index of the deciding interval in skb->cb[1],
// the deciding step in skb->cb[2] and the deciding object's id in
// skb->cb[3] (BPF_PROG_TEST_RUN hands cb back, which is how tests and
// enimasq-dbg explain a verdict). Every decision counts in
// enimasq_policy_verdicts (per CPU, by direction, verdict and step); with
// events on, a denied packet is reported in enimasq_policy_events.
//
// They are stateful, as NetworkPolicy is: a packet allowed at any step
// opens a connection in enimasq_policy_ct (TCP and UDP by ports, ICMP echo
// by its identifier and the direction of its requests), keyed by pod and
// peer so that both directions find it, and every packet of a tracked
// connection passes, either way (an echo's requests one way, its replies
// the other), until it has been idle for the protocol's timeout (a TCP RST
// closes it at once).
// The map is an LRU hash: bounded, the least recently used connection goes
// first. enimasq_policy_mode[0] holds the enforcing mode (strict: a pod that
// nothing decides is denied) and whether events are on.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define POLICY_INLINE 32 /* intervals in a map value; more go in chunks */
#define POLICY_CHUNK 64  /* intervals in a chunk */
#define POLICY_MAX_ENTRIES 65536
#define CHUNK_MAX_ENTRIES 65536

/* Reasons, in skb->cb[0]. */
#define REASON_ALLOWED 1   /* a port entry of the pod's longest matching key allows */
#define REASON_DENIED 2    /* the pod's longest matching key lists nothing that allows */
#define REASON_NO_POLICY 3 /* the pod has no key: no PolicyEndpoint selects it */
#define REASON_ARP 4       /* ARP: passed */
#define REASON_TRACKED 5   /* a packet of a connection the policy allowed */
#define REASON_STRICT 6    /* no policy selects the pod, and the mode is strict */
#define REASON_NEIGHBOR 7  /* IPv6 neighbour (RFC 4861) or multicast listener (RFC 3810) discovery: passed */
#define REASON_SPOOFED 8   /* the source is a pod address of another device, or of none */
#define REASON_MALFORMED 9 /* a frame the programs cannot judge: dropped */
#define REASON_FRAGMENT 10 /* a later fragment of a datagram whose first fragment passed */
#define REASON_FRAGMENT_UNKNOWN 11 /* a later fragment of no datagram whose first fragment passed */
#define REASON_ADMIN_ACCEPT 12 /* an Admin-tier ClusterPolicyEndpoint rule accepts */
#define REASON_ADMIN_DENY 13   /* an Admin-tier ClusterPolicyEndpoint rule denies */
#define REASON_BASELINE_ACCEPT 14 /* a Baseline-tier rule accepts */
#define REASON_BASELINE_DENY 15   /* a Baseline-tier rule denies */
#define REASON_INCOMPLETE 16   /* the pod's version in force is not whole in the maps (a key or chunk missing, or closed): denied */

/* Steps, in skb->cb[2] and the counters. */
#define STEP_NONE 0
#define STEP_ADMIN 1
#define STEP_NAMESPACE 2
#define STEP_BASELINE 3
#define STEP_DEFAULT 4

/* The outcome word of an interval: an action in the top two bits, the id of
 * the deciding object in the others (0: resolved by the agent). */
#define OUTCOME_ACTION(o) ((o) >> 30)
#define OUTCOME_OBJECT(o) ((o) & 0x3fffffff)
#define ACTION_NONE 0
#define ACTION_ACCEPT 1
#define ACTION_DENY 2

/* Flags of a map value. */
#define VALUE_NOT_ISOLATED 1 /* NetworkPolicy: the pod is selected but not isolated in the direction */

#define LOOPBACK_IFINDEX 1

/* An allowed packet goes on to whatever else runs on the device. */
#define VERDICT_PASS TC_ACT_UNSPEC

#define MODE_STRICT 1 /* bit 0 of enimasq_policy_mode[0] */
#define MODE_EVENTS 2 /* bit 1: denied packets go to enimasq_policy_events */
#define MODE_AUDIT 4  /* bit 2: a packet the policy denies passes, counted and reported as audited */

/* skb->cb[4] of a packet the policy denied and audit mode passed. */
#define AUDITED 1

#define CT_MAX_ENTRIES 65536
#define NSEC 1000000000ULL
#define CT_TIMEOUT_TCP (3600 * NSEC)
#define CT_TIMEOUT_UDP (60 * NSEC)
#define CT_TIMEOUT_ICMP (30 * NSEC)

#define NO_INTERVAL 0xffffffff
#define SEARCH_FOUND 1
#define SEARCH_NONE 0
#define SEARCH_MISSING -1

/* Fragments: the first is judged, the later ones follow its verdict for as
 * long as the kernel would wait to reassemble them. */
#define FRAG_MAX_ENTRIES 8192
#define FRAG_TIMEOUT (60 * NSEC)
#define FRAG_NONE 0
#define FRAG_FIRST 1
#define FRAG_LATER 2

/* IPv6 extension headers walked to the transport header; more is dropped. */
#define IPV6_MAX_EXT_HEADERS 8

/* The key of a policy map: the pod, the version of the pod's policy it
 * belongs to (enimasq_policy_versions), the peer; the prefix length covers
 * the pod, the version and the peer's prefix. */
struct policy_v4_key {
	__u32 prefixlen;
	__u8 pod[4];
	__u32 version;
	__u8 peer[4];
};

struct policy_v6_key {
	__u32 prefixlen;
	__u8 pod[16];
	__u32 version;
	__u8 peer[16];
};

/* An interval of (protocol << 16 | destination port), both ends included;
 * a packet without ports (ICMP, other protocols) is at port 0, so only an
 * interval for every port of its protocol holds it. first and second are
 * outcomes: the NetworkPolicy maps use first (an allow, ACTION_ACCEPT), the
 * cluster maps first for the Admin tier and second for the Baseline tier
 * (ACTION_NONE: the tier decides nothing there, Pass included). */
struct interval {
	__u32 lo;
	__u32 hi;
	__u32 first;
	__u32 second;
};

struct policy_value {
	__u32 flags;
	__u32 count;   /* intervals in all */
	__u8 list[16]; /* the id of the chunks of the intervals past the inline ones */
	struct interval iv[POLICY_INLINE];
};

struct chunk_key {
	__u8 list[16];
	__u32 index;
};

struct chunk {
	struct interval iv[POLICY_CHUNK];
};

#define POLICY_MAP(_name, _key)                              \
	struct {                                             \
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);         \
		__type(key, _key);                           \
		__type(value, struct policy_value);          \
		__uint(max_entries, POLICY_MAX_ENTRIES);     \
		__uint(map_flags, BPF_F_NO_PREALLOC);        \
	} _name SEC(".maps")

#define CHUNK_MAP(_name)                                     \
	struct {                                             \
		__uint(type, BPF_MAP_TYPE_HASH);             \
		__type(key, struct chunk_key);               \
		__type(value, struct chunk);                 \
		__uint(max_entries, CHUNK_MAX_ENTRIES);      \
		__uint(map_flags, BPF_F_NO_PREALLOC);        \
	} _name SEC(".maps")

POLICY_MAP(enimasq_egress_v4, struct policy_v4_key);
POLICY_MAP(enimasq_egress_v6, struct policy_v6_key);
POLICY_MAP(enimasq_ingress_v4, struct policy_v4_key);
POLICY_MAP(enimasq_ingress_v6, struct policy_v6_key);
CHUNK_MAP(enimasq_policy_chunks);

POLICY_MAP(enimasq_cluster_egress_v4, struct policy_v4_key);
POLICY_MAP(enimasq_cluster_egress_v6, struct policy_v6_key);
POLICY_MAP(enimasq_cluster_ingress_v4, struct policy_v4_key);
POLICY_MAP(enimasq_cluster_ingress_v6, struct policy_v6_key);
CHUNK_MAP(enimasq_cluster_chunks);

/* The decisions, per CPU: index (egress ? 8 : 0) + (deny ? 4 : 0) + step - 1,
 * and, for the denials audit mode passed, 16 + (egress ? 4 : 0) + step - 1. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 24);
} enimasq_policy_verdicts SEC(".maps");

/* A denied packet, with events on. */
struct policy_event {
	__u8 src[16];
	__u8 dst[16];
	__u32 ifindex;
	__u32 object;
	__u16 sport;
	__u16 dport;
	__u8 family;
	__u8 protocol;
	__u8 egress;
	__u8 step;
	__u32 reason;
	__u32 flags; /* AUDITED: denied, and passed by audit mode */
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} enimasq_policy_events SEC(".maps");

/* A tracked connection: the device it was seen on (the pod's host-side
 * device), the pod's and the peer's addresses (IPv4 in the first 4 bytes)
 * and ports (the echo identifier twice for ICMP), seen from the pod
 * whichever way the packet goes. The device makes a new pod on an old IP
 * (another veth) start with no connection of the old one. An ICMP echo
 * also names the pod's direction its requests take (CT_EGRESS: the pod
 * asks, the peer answers; CT_INGRESS: the other way round), so that only
 * a reply going the other way passes as tracked: the peer's own requests
 * with the same identifier, and replies going the requests' way, are
 * judged by the policy. */
struct ct_key {
	__u8 pod[16];
	__u8 peer[16];
	__u16 pod_port;
	__u16 peer_port;
	__u8 protocol;
	__u8 family;
	__u8 echo;    /* ICMP echo: CT_EGRESS or CT_INGRESS, the requests' direction; 0 otherwise */
	__u8 pad;
	__u32 ifindex;
};

#define CT_EGRESS 1  /* ct_value.opened_by, ct_key.echo: the pod's egress */
#define CT_INGRESS 2 /* its ingress */

struct ct_value {
	__u64 last_seen; /* bpf_ktime_get_ns */
	__u32 opened_by; /* CT_EGRESS: the pod's egress, CT_INGRESS: its ingress */
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

/* The node's pods: pod address (IPv4 in the first 4 bytes) -> the ifindex
 * of its host-side device, for every address routed to a pod's device.
 * What a pod sends must come from its own device, and what a pod receives
 * from a local pod's address must have entered the node by that pod's
 * device, so that no pod is judged as another by a forged source. */
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

/* The version of each pod's policy in force, per tier: pod address (as in
 * enimasq_policy_pods) -> { NetworkPolicy version, cluster version }. A
 * pod's keys carry their version; the agent writes every key of a new
 * version before it switches the pod to it here, and deletes the old
 * version's keys only after, so a pod goes from one policy to the next in
 * one step. A pod without an entry is at version 0, which the agent never
 * writes: no policy. VERSION_CLOSED: the pod's first version could not be
 * written whole; it is denied (fail closed). */
struct pod_version {
	__u32 version[2]; /* 0: NetworkPolicy, 1: cluster */
};

#define VERSION_CLOSED 0xffffffff

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct pod_key);
	__type(value, struct pod_version);
	__uint(max_entries, 65536);
} enimasq_policy_versions SEC(".maps");

/* The datagrams whose first fragment passed, as Cilium's
 * cilium_ipv4_frag_datagrams: later fragments carry no ports, and follow
 * the first one's verdict. */
struct frag_key {
	__u8 family;
	__u8 protocol;
	__u8 pad[2];
	__u32 id; /* IPv4: the 16-bit identification; IPv6: the fragment header's */
	__u8 src[16];
	__u8 dst[16];
	__u32 ifindex;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag_key);
	__type(value, __u64); /* when the first fragment passed */
	__uint(max_entries, FRAG_MAX_ENTRIES);
} enimasq_policy_frags SEC(".maps");

/* The IP header fields the policy looks at, read from the packet with
 * bpf_skb_load_bytes: headers in the paged part of an skb (a large frame
 * sent through AF_PACKET) are read like linear ones. */
struct pkt {
	__u8 src[16];  /* first: 8-byte aligned for same_addr and unspecified */
	__u8 dst[16];
	__u8 family;   /* 4 or 6 */
	__u8 protocol; /* the transport protocol, past IPv6 extension headers */
	__u8 hop_limit;
	__u8 frag;     /* FRAG_NONE, FRAG_FIRST, FRAG_LATER */
	__u32 frag_id;
	__u32 l4off;   /* offset of the transport header */
	__u32 ifindex; /* the device the program runs on */
	__u32 ingress_ifindex; /* the device the packet entered the node by, 0 if the node sent it */
} __attribute__((aligned(8)));

/* The fields of the transport header that the policy looks at. */
struct flow {
	__u32 protocol;
	__u32 port;       /* destination port */
	__u32 sport;      /* source port */
	__u8 port_known;  /* false for ICMP, later fragments, other protocols */
	__u8 echo;        /* ECHO_REQUEST, ECHO_REPLY (id in sport), 0: no echo */
	__u8 rst;         /* a TCP RST */
	__u8 icmp_type;   /* ICMP and ICMPv6 */
};

#define ECHO_REQUEST 1
#define ECHO_REPLY 2

#define PARSE_IP 0
#define PARSE_ARP 1
#define PARSE_BAD -1

/* header returns len bytes of the packet at off: a pointer into the
 * linear part where it holds them, else a copy in buf made with
 * bpf_skb_load_bytes, which reads the paged part too (a large frame sent
 * through AF_PACKET has only its Ethernet header linear); NULL past the
 * packet's end. len is a constant. */
#define DIRECT_MAX_OFF 512
static __always_inline const void *header(struct __sk_buff *skb, __u32 off, void *buf, const __u32 len)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (off <= DIRECT_MAX_OFF && data + off + len <= data_end)
		return data + off;
	if (bpf_skb_load_bytes(skb, off, buf, len))
		return 0;
	return buf;
}

static __always_inline int is_ipv6_ext(__u8 nh)
{
	return nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING || nh == IPPROTO_DSTOPTS || nh == IPPROTO_FRAGMENT ||
	       nh == IPPROTO_AH;
}

/* parse reads the frame's Ethernet and IP headers (and IPv6's extension
 * headers) into p. It refuses what it cannot judge: a VLAN tag (stripped by
 * the kernel into the skb, or still in the frame), an EtherType other than
 * IPv4, IPv6 and ARP, a truncated or inconsistent IP header, more IPv6
 * extension headers than it walks. */
struct l2l3 {
	__u8 mac[2]; /* the source MAC's last bytes, so that the rest is aligned */
	__be16 proto;
	union {
		struct iphdr ip;
		struct ipv6hdr ip6;
	};
};

static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	struct l2l3 buf;
	const struct l2l3 *h;

	p->ifindex = skb->ifindex;
	p->ingress_ifindex = skb->ingress_ifindex;
	if (skb->vlan_present)
		return PARSE_BAD;
	/* The EtherType and the 20 bytes after it: all of an IPv4 header,
	 * options aside, and enough to tell IPv6 and ARP. */
	h = header(skb, 10, &buf, 4 + sizeof(struct iphdr));
	if (!h)
		return PARSE_BAD; /* shorter than any IP or ARP frame */
	if (h->proto == bpf_htons(ETH_P_ARP))
		return PARSE_ARP;
	if (h->proto == bpf_htons(ETH_P_IP)) {
		__u16 frag_off;

		if (h->ip.version != 4 || h->ip.ihl < 5)
			return PARSE_BAD;
		p->family = 4;
		p->protocol = h->ip.protocol;
		p->hop_limit = h->ip.ttl;
		p->l4off = ETH_HLEN + h->ip.ihl * 4;
		*(__u32 *)p->src = h->ip.saddr;
		*(__u32 *)p->dst = h->ip.daddr;
		frag_off = bpf_ntohs(h->ip.frag_off);
		if (frag_off & 0x1fff)
			p->frag = FRAG_LATER;
		else if (frag_off & 0x2000) /* more fragments */
			p->frag = FRAG_FIRST;
		p->frag_id = h->ip.id;
		return PARSE_IP;
	}
	if (h->proto == bpf_htons(ETH_P_IPV6)) {
		__u32 off = ETH_HLEN + sizeof(struct ipv6hdr);
		__u8 nh;

		h = header(skb, 10, &buf, sizeof(buf));
		if (!h || h->ip6.version != 6)
			return PARSE_BAD;
		p->family = 6;
		p->hop_limit = h->ip6.hop_limit;
		__builtin_memcpy(p->src, &h->ip6.saddr, 16);
		__builtin_memcpy(p->dst, &h->ip6.daddr, 16);
		nh = h->ip6.nexthdr;
#pragma unroll
		for (int i = 0; i < IPV6_MAX_EXT_HEADERS; i++) {
			__u8 xbuf[8];
			const __u8 *x;

			if (!is_ipv6_ext(nh) || p->frag == FRAG_LATER)
				break;
			x = header(skb, off, xbuf, sizeof(xbuf));
			if (!x)
				return PARSE_BAD;
			if (nh == IPPROTO_FRAGMENT) {
				__u16 frag_off = ((__u16)x[2] << 8) | x[3];

				if (frag_off & 0xfff8)
					p->frag = FRAG_LATER; /* the rest is data */
				else if (frag_off & 1)
					p->frag = FRAG_FIRST;
				__builtin_memcpy(&p->frag_id, x + 4, 4);
				off += 8;
			} else if (nh == IPPROTO_AH) {
				off += ((__u32)x[1] + 2) * 4;
			} else {
				off += ((__u32)x[1] + 1) * 8;
			}
			nh = x[0];
		}
		if (is_ipv6_ext(nh) && p->frag != FRAG_LATER)
			return PARSE_BAD;
		p->protocol = nh;
		p->l4off = off;
		return PARSE_IP;
	}
	return PARSE_BAD;
}

static __always_inline int has_ports(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

static __always_inline int is_icmp(__u8 proto)
{
	return proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6;
}

/* echo_of is what an ICMP type is in its own family: ICMPv4's echo request
 * and reply are 8 and 0, ICMPv6's 128 and 129 (ICMPv4's type 128, or
 * ICMPv6 over IPv4, is no echo): ECHO_REQUEST, ECHO_REPLY or 0. */
static __always_inline __u8 echo_of(__u8 family, __u8 proto, __u8 type)
{
	if (family == 4 && proto == IPPROTO_ICMP)
		return type == 8 ? ECHO_REQUEST : type == 0 ? ECHO_REPLY : 0;
	if (family == 6 && proto == IPPROTO_ICMPV6)
		return type == 128 ? ECHO_REQUEST : type == 129 ? ECHO_REPLY : 0;
	return 0;
}

/* read_l4 reads the ports of TCP, UDP and SCTP (all three have the source
 * port then the destination port first), the type and echo identifier of
 * ICMP. A first fragment or a whole datagram too short for them is refused
 * (RFC 1858's tiny fragments): what cannot be read cannot be judged. */
static __always_inline int read_l4(struct __sk_buff *skb, const struct pkt *p, struct flow *f)
{
	__u8 buf[14];
	const __u8 *b;

	f->protocol = p->protocol;
	if (!has_ports(p->protocol) && !is_icmp(p->protocol))
		return 0;
	/* TCP's flags are in its 14th byte; the others need 8. */
	if (p->protocol == IPPROTO_TCP) {
		b = header(skb, p->l4off, buf, 14);
		if (!b)
			return -1;
		f->rst = (b[13] & 0x04) != 0;
	} else {
		b = header(skb, p->l4off, buf, 8);
		if (!b)
			return -1;
	}
	if (is_icmp(p->protocol)) {
		/* type, code, checksum, identifier */
		f->icmp_type = b[0];
		f->echo = echo_of(p->family, p->protocol, b[0]);
		f->sport = ((__u32)b[4] << 8) | b[5];
		return 0;
	}
	f->sport = ((__u32)b[0] << 8) | b[1];
	f->port = ((__u32)b[2] << 8) | b[3];
	f->port_known = 1;
	return 0;
}

static __always_inline __u64 ct_timeout(__u8 proto)
{
	if (proto == IPPROTO_TCP)
		return CT_TIMEOUT_TCP;
	if (is_icmp(proto))
		return CT_TIMEOUT_ICMP;
	return CT_TIMEOUT_UDP;
}

/* echo_direction is the pod's direction of the requests of an echo seen
 * going one way (egress): that way for a request, the other for a reply. */
static __always_inline __u8 echo_direction(__u8 echo, int egress)
{
	return (echo == ECHO_REQUEST) == (egress != 0) ? CT_EGRESS : CT_INGRESS;
}

/* ct_key_of fills the connection key of the packet seen from the pod. */
static __always_inline void ct_key_of(struct ct_key *k, const struct flow *f, int egress)
{
	k->protocol = f->protocol;
	if (f->echo) {
		k->pod_port = f->sport;
		k->peer_port = f->sport;
		k->echo = echo_direction(f->echo, egress);
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
 * requests (never a reply: it opens nothing, and its key names the other
 * way's requests). */
static __always_inline void track(struct ct_key *k, const struct flow *f, int egress)
{
	struct ct_value v = { .opened_by = egress ? CT_EGRESS : CT_INGRESS };

	if ((!f->port_known && f->echo != ECHO_REQUEST) || f->rst)
		return;
	v.last_seen = bpf_ktime_get_ns();
	bpf_map_update_elem(&enimasq_policy_ct, k, &v, BPF_ANY);
}

static __always_inline __u32 mode(void)
{
	__u32 zero = 0;
	__u32 *m = bpf_map_lookup_elem(&enimasq_policy_mode, &zero);

	return m ? *m : 0;
}

/* The result of a search: SEARCH_FOUND with the interval's index and
 * outcomes, SEARCH_NONE, or SEARCH_MISSING. */
struct found {
	__s32 r;
	__u32 idx;
	__u32 first;
	__u32 second;
};

/* The state of a walk over a value's chunks (bpf_loop). */
struct chunk_walk {
	struct chunk_key key;
	void *chunks;
	__u32 k;
	__u32 left; /* intervals in this chunk and the ones after it */
	struct found *out;
};

/* last_at_or_before is how many of the first n (<= POLICY_CHUNK) intervals
 * start at or before k: a binary search. */
static __always_inline __u32 last_at_or_before(const struct interval *iv, __u32 n, __u32 k, __u32 mask)
{
	__u32 lo = 0, hi = n;

	for (int i = 0; i < 7; i++) { /* 2^6 = POLICY_CHUNK */
		__u32 mid;

		if (lo >= hi)
			break;
		mid = (lo + hi) / 2;
		if (iv[mid & mask].lo <= k)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* chunk_step looks at chunk i: the search ends in it if it is missing or
 * its last interval ends at or after k. */
static long chunk_step(__u64 i, void *ctx)
{
	struct chunk_walk *w = ctx;
	const struct chunk *ch;
	const struct interval *e;
	__u32 n, at;

	w->key.index = i;
	ch = bpf_map_lookup_elem(w->chunks, &w->key);
	if (!ch) {
		w->out->r = SEARCH_MISSING;
		return 1;
	}
	n = w->left < POLICY_CHUNK ? w->left : POLICY_CHUNK;
	if (n == 0)
		return 1;
	if (ch->iv[(n - 1) & (POLICY_CHUNK - 1)].hi < w->k) {
		w->left -= n;
		return 0; /* past this chunk */
	}
	at = last_at_or_before(ch->iv, n, w->k, POLICY_CHUNK - 1);
	if (at == 0)
		return 1; /* in the gap before this chunk */
	e = &ch->iv[(at - 1) & (POLICY_CHUNK - 1)];
	if (w->k <= e->hi) {
		w->out->r = SEARCH_FOUND;
		w->out->idx = POLICY_INLINE + i * POLICY_CHUNK + at - 1;
		w->out->first = e->first;
		w->out->second = e->second;
	}
	return 1;
}

/* search finds the interval of v that holds k (out->r SEARCH_FOUND, with
 * its index and outcomes), or none (SEARCH_NONE), or finds that a chunk the
 * value counts is not in its chunk map (SEARCH_MISSING: the caller denies,
 * as an incomplete list must never decide as if it were whole). Intervals
 * are sorted and disjoint, so the one that can hold k is the last that
 * starts at or before it: a binary search over the inline intervals, then,
 * past them, a walk over the chunks to the one that ends at or after k and
 * a binary search in it. A function of its own, verified once for every
 * caller. */
__attribute__((noinline)) int search(const struct policy_value *v, __u32 k, int cluster, struct found *out)
{
	__u32 n, inl, at;
	const struct interval *e;
	struct chunk_walk w = {};

	if (!out)
		return 0;
	out->r = SEARCH_NONE;
	if (!v)
		return 0;
	n = v->count;
	inl = n < POLICY_INLINE ? n : POLICY_INLINE;
	if (inl == 0)
		return 0;
	at = last_at_or_before(v->iv, inl, k, POLICY_INLINE - 1);
	if (at == 0)
		return 0; /* before the first interval */
	e = &v->iv[(at - 1) & (POLICY_INLINE - 1)];
	if (k <= e->hi) {
		out->r = SEARCH_FOUND;
		out->idx = at - 1;
		out->first = e->first;
		out->second = e->second;
		return 0;
	}
	if (at < POLICY_INLINE || n <= POLICY_INLINE)
		return 0;
	__builtin_memcpy(w.key.list, v->list, sizeof(w.key.list));
	w.chunks = cluster ? (void *)&enimasq_cluster_chunks : (void *)&enimasq_policy_chunks;
	w.k = k;
	w.left = n - POLICY_INLINE;
	w.out = out;
	/* A walk bpf_loop refuses (more chunks than it iterates) is a list
	 * that cannot be judged: denied. */
	if (bpf_loop((w.left + POLICY_CHUNK - 1) / POLICY_CHUNK, chunk_step, &w, 0) < 0)
		out->r = SEARCH_MISSING;
	return 0;
}

/* present says whether a map lookup found a value, without letting the
 * compiler OR two pointers together (which the verifier refuses). */
static __always_inline int present(const void *v)
{
	__u64 x = (__u64)(long)v;

	asm volatile("" : "+r"(x));
	return x != 0;
}

/* A decision of the steps, before connection tracking. */
struct decision {
	__u32 reason;
	__u32 step;
	__u32 object;
	__u32 idx;
	int deny;
};

static __always_inline void decided(struct decision *d, __u32 reason, __u32 step, __u32 outcome, __u32 idx, int deny)
{
	d->reason = reason;
	d->step = step;
	d->object = OUTCOME_OBJECT(outcome);
	d->idx = idx;
	d->deny = deny;
}

/* evaluate runs the steps in order on the pod's cluster value (cp) and
 * NetworkPolicy value (np), either of which may be missing, for the point
 * k = protocol << 16 | port. */
static __always_inline void evaluate(const struct policy_value *cp, const struct policy_value *np, __u32 k,
				     struct decision *d)
{
	struct found fo = {};
	__u32 base = 0, base_idx = NO_INTERVAL;

	if (present(cp)) {
		search(cp, k, 1, &fo);
		if (fo.r == SEARCH_MISSING)
			return decided(d, REASON_INCOMPLETE, STEP_ADMIN, 0, NO_INTERVAL, 1);
		if (fo.r == SEARCH_FOUND) {
			if (OUTCOME_ACTION(fo.first) == ACTION_ACCEPT)
				return decided(d, REASON_ADMIN_ACCEPT, STEP_ADMIN, fo.first, fo.idx, 0);
			if (OUTCOME_ACTION(fo.first) == ACTION_DENY)
				return decided(d, REASON_ADMIN_DENY, STEP_ADMIN, fo.first, fo.idx, 1);
			base = fo.second;
			base_idx = fo.idx;
		}
	}
	if (present(np) && !(np->flags & VALUE_NOT_ISOLATED)) {
		search(np, k, 0, &fo);
		if (fo.r == SEARCH_MISSING)
			return decided(d, REASON_INCOMPLETE, STEP_NAMESPACE, 0, NO_INTERVAL, 1);
		if (fo.r == SEARCH_FOUND && OUTCOME_ACTION(fo.first) == ACTION_ACCEPT)
			return decided(d, REASON_ALLOWED, STEP_NAMESPACE, fo.first, fo.idx, 0);
		return decided(d, REASON_DENIED, STEP_NAMESPACE, 0, NO_INTERVAL, 1);
	}
	if (OUTCOME_ACTION(base) == ACTION_ACCEPT)
		return decided(d, REASON_BASELINE_ACCEPT, STEP_BASELINE, base, base_idx, 0);
	if (OUTCOME_ACTION(base) == ACTION_DENY)
		return decided(d, REASON_BASELINE_DENY, STEP_BASELINE, base, base_idx, 1);
	/* Strict mode denies a pod no NetworkPolicy selects; one that selects
	 * it without isolating the direction allows it, as the AWS agent's
	 * DEFAULT_ALLOW pod state. */
	if ((mode() & MODE_STRICT) && !present(np))
		return decided(d, REASON_STRICT, STEP_DEFAULT, 0, NO_INTERVAL, 1);
	return decided(d, REASON_NO_POLICY, STEP_DEFAULT, 0, NO_INTERVAL, 0);
}

static __always_inline void count(int egress, const struct decision *d, int audited)
{
	__u32 key = audited ? 16 + (egress ? 4 : 0) + ((d->step - 1) & 3)
			    : (egress ? 8 : 0) + (d->deny ? 4 : 0) + ((d->step - 1) & 3);
	__u64 *n = bpf_map_lookup_elem(&enimasq_policy_verdicts, &key);

	if (n)
		*n += 1;
}

static __always_inline int same_addr(const __u8 *a, const __u8 *b, int v6)
{
	if (!v6)
		return *(const __u32 *)a == *(const __u32 *)b;
	return ((const __u64 *)a)[0] == ((const __u64 *)b)[0] && ((const __u64 *)a)[1] == ((const __u64 *)b)[1];
}

/* is_icmp_error says whether an ICMP type is an error that quotes a packet:
 * destination unreachable, time exceeded, parameter problem (and ICMPv6's
 * packet too big). */
static __always_inline int is_icmp_error(const struct pkt *p, const struct flow *f)
{
	if (p->protocol == IPPROTO_ICMP)
		return f->icmp_type == 3 || f->icmp_type == 11 || f->icmp_type == 12;
	if (p->protocol == IPPROTO_ICMPV6)
		return f->icmp_type >= 1 && f->icmp_type <= 4;
	return 0;
}

/* pod_device is the ifindex of the device a pod address is routed to, 0
 * for an address that is no pod's. */
static __always_inline __u32 pod_device(const struct pkt *p, const __u8 *addr)
{
	struct pod_key k = { .family = p->family };
	__u32 *ifindex;

	__builtin_memcpy(k.addr, addr, 16);
	ifindex = bpf_map_lookup_elem(&enimasq_policy_pods, &k);
	return ifindex ? *ifindex : 0;
}

/* icmp_related says whether an ICMP error is about a live tracked
 * connection of this pod on this device: the packet it quotes was sent by
 * the pod (an error the pod receives: the quoted source is the outer
 * destination; the sender is the quoted destination or a router on the
 * way, never another local pod) or to it (an error the pod sends: the
 * quoted destination is
 * the outer source and the quoted source the outer destination), and is a
 * packet of that connection: for an echo, a request or a reply going the
 * way the tracked echo's requests or replies go (the quoted packet went
 * the other way from the error). Only quotes with an IPv4 header (with or
 * without options) or an IPv6 header without extension headers are
 * read. */
static __always_inline int icmp_related(struct __sk_buff *skb, const struct pkt *p, int egress)
{
	struct ct_key k = { .family = p->family, .ifindex = p->ifindex };
	__u32 off = p->l4off + 8, qoff;
	__u8 qsrc[16] = {}, qdst[16] = {};
	__u8 ports[8];
	struct ct_value *v;
	int v6 = p->family == 6;

	if (v6) {
		struct ipv6hdr in;

		if (bpf_skb_load_bytes(skb, off, &in, sizeof(in)) || in.version != 6)
			return 0;
		k.protocol = in.nexthdr;
		__builtin_memcpy(qsrc, &in.saddr, 16);
		__builtin_memcpy(qdst, &in.daddr, 16);
		qoff = off + sizeof(in);
	} else {
		struct iphdr in;

		if (bpf_skb_load_bytes(skb, off, &in, sizeof(in)) || in.version != 4 || in.ihl < 5)
			return 0;
		k.protocol = in.protocol;
		__builtin_memcpy(qsrc, &in.saddr, 4);
		__builtin_memcpy(qdst, &in.daddr, 4);
		qoff = off + in.ihl * 4;
	}
	if (egress) {
		if (!same_addr(qdst, p->src, v6) || !same_addr(qsrc, p->dst, v6))
			return 0;
		__builtin_memcpy(k.pod, qdst, 16);
		__builtin_memcpy(k.peer, qsrc, 16);
	} else {
		/* The error may come from a router on the way (path MTU
		 * discovery), but not from another pod of the node: a local pod
		 * may only send errors about its own connections. */
		if (!same_addr(qsrc, p->dst, v6) || (!same_addr(p->src, qdst, v6) && pod_device(p, p->src)))
			return 0;
		__builtin_memcpy(k.pod, qsrc, 16);
		__builtin_memcpy(k.peer, qdst, 16);
	}
	if (bpf_skb_load_bytes(skb, qoff, ports, sizeof(ports)))
		return 0;
	if (is_icmp(k.protocol)) {
		__u8 echo = echo_of(k.family, k.protocol, ports[0]);

		if (!echo)
			return 0; /* only an echo is tracked */
		k.pod_port = ((__u16)ports[4] << 8) | ports[5]; /* the echo's identifier */
		k.peer_port = k.pod_port;
		k.echo = echo_direction(echo, !egress);
	} else if (has_ports(k.protocol)) {
		__u16 sport = ((__u16)ports[0] << 8) | ports[1], dport = ((__u16)ports[2] << 8) | ports[3];

		/* The quoted packet went the other way. */
		k.pod_port = egress ? dport : sport;
		k.peer_port = egress ? sport : dport;
	} else {
		return 0;
	}
	v = bpf_map_lookup_elem(&enimasq_policy_ct, &k);
	return v && bpf_ktime_get_ns() - v->last_seen <= ct_timeout(k.protocol);
}

/* version_of reads the versions of a pod's policy in force (0 for a pod
 * without an entry: no policy). */
static __always_inline void version_of(const struct pkt *p, const __u8 *pod, __u32 *versions)
{
	struct pod_key k = { .family = p->family };
	struct pod_version *v;

	__builtin_memcpy(k.addr, pod, 16);
	v = bpf_map_lookup_elem(&enimasq_policy_versions, &k);
	versions[0] = v ? v->version[0] : 0;
	versions[1] = v ? v->version[1] : 0;
}

/* decide passes the packets of tracked connections, decides the others by
 * the steps (the maps are looked up only then: a tracked packet costs no
 * policy lookup), counts the decision, and tracks what a step allows for a
 * pod with any policy in the direction. In audit mode a denied packet
 * passes, marked AUDITED and counted apart; it is not tracked, so that
 * every packet of its flow is judged, counted and reported again, and
 * nothing stays open when the mode goes off. */
static __always_inline int decide(struct __sk_buff *skb, const struct pkt *p, const struct flow *f, struct ct_key *ct,
				  int egress)
{
	const struct policy_value *cp = NULL, *np = NULL;
	struct decision d = {};
	__u32 versions[2];

	ct_key_of(ct, f, egress);
	if (tracked(ct, f)) {
		skb->cb[0] = REASON_TRACKED;
		return VERDICT_PASS;
	}
	version_of(p, ct->pod, versions);
	if (versions[0] == VERSION_CLOSED || versions[1] == VERSION_CLOSED) {
		/* A first version that could not be written whole: closed. */
		decided(&d, REASON_INCOMPLETE, versions[1] == VERSION_CLOSED ? STEP_ADMIN : STEP_NAMESPACE, 0, NO_INTERVAL, 1);
		goto out;
	}
	if (p->family == 6) {
		struct policy_v6_key key = { .prefixlen = 256 + 32 };

		__builtin_memcpy(key.pod, ct->pod, 16);
		__builtin_memcpy(key.peer, ct->peer, 16);
		key.version = versions[0];
		np = bpf_map_lookup_elem(egress ? (void *)&enimasq_egress_v6 : (void *)&enimasq_ingress_v6, &key);
		key.version = versions[1];
		cp = bpf_map_lookup_elem(egress ? (void *)&enimasq_cluster_egress_v6 : (void *)&enimasq_cluster_ingress_v6,
					 &key);
	} else {
		struct policy_v4_key key = { .prefixlen = 64 + 32 };

		__builtin_memcpy(key.pod, ct->pod, 4);
		__builtin_memcpy(key.peer, ct->peer, 4);
		key.version = versions[0];
		np = bpf_map_lookup_elem(egress ? (void *)&enimasq_egress_v4 : (void *)&enimasq_ingress_v4, &key);
		key.version = versions[1];
		cp = bpf_map_lookup_elem(egress ? (void *)&enimasq_cluster_egress_v4 : (void *)&enimasq_cluster_ingress_v4,
					 &key);
	}
	/* Every version the agent brings into force holds the root key (the
	 * whole family) in each map of its tier, both directions: a version
	 * without a key here is not in these maps (maps replaced under it, or
	 * a foreign writer). Closed, never judged as "no policy". */
	if ((versions[0] && !present(np)) || (versions[1] && !present(cp))) {
		decided(&d, REASON_INCOMPLETE, versions[1] && !present(cp) ? STEP_ADMIN : STEP_NAMESPACE, 0, NO_INTERVAL,
			1);
		goto out;
	}
	evaluate(cp, np, (f->protocol << 16) | (f->port_known ? f->port : 0), &d);
out:
	skb->cb[0] = d.reason;
	skb->cb[1] = d.idx;
	skb->cb[2] = d.step;
	skb->cb[3] = d.object;
	if (d.deny && (mode() & MODE_AUDIT)) {
		skb->cb[4] = AUDITED;
		count(egress, &d, 1);
		return VERDICT_PASS;
	}
	count(egress, &d, 0);
	if (d.deny)
		return TC_ACT_SHOT;
	if (present(cp) || present(np))
		track(ct, f, egress);
	return VERDICT_PASS;
}

static __always_inline void frag_key_of(struct frag_key *k, struct __sk_buff *skb, const struct pkt *p)
{
	k->family = p->family;
	/* IPv6 reassembles by addresses and identification alone (RFC 8200):
	 * a later fragment's next header is the Fragment header's, which may
	 * be an extension header the first fragment walked past. */
	k->protocol = p->family == 4 ? p->protocol : 0;
	k->id = p->frag_id;
	k->ifindex = p->ifindex;
	__builtin_memcpy(k->src, p->src, 16);
	__builtin_memcpy(k->dst, p->dst, 16);
}

/* later_fragment passes a later fragment of a datagram whose first
 * fragment passed on this device in the last FRAG_TIMEOUT, and drops the
 * others (their first fragment was denied, or not seen yet). */
static __always_inline int later_fragment(struct __sk_buff *skb, const struct pkt *p)
{
	struct frag_key k = {};
	__u64 *first;

	frag_key_of(&k, skb, p);
	first = bpf_map_lookup_elem(&enimasq_policy_frags, &k);
	if (first && bpf_ktime_get_ns() - *first <= FRAG_TIMEOUT) {
		skb->cb[0] = REASON_FRAGMENT;
		return VERDICT_PASS;
	}
	skb->cb[0] = REASON_FRAGMENT_UNKNOWN;
	return TC_ACT_SHOT;
}

static __always_inline void first_fragment_passed(struct __sk_buff *skb, const struct pkt *p)
{
	struct frag_key k = {};
	__u64 now = bpf_ktime_get_ns();

	frag_key_of(&k, skb, p);
	bpf_map_update_elem(&enimasq_policy_frags, &k, &now, BPF_ANY);
}

static __always_inline int link_local(const __u8 *a)
{
	return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

static __always_inline int unspecified(const __u8 *a)
{
	return ((const __u64 *)a)[0] == 0 && ((const __u64 *)a)[1] == 0;
}

/* link_scope says whether an IPv6 destination stays on the link: a
 * link-local unicast address or a link-local multicast group (ff02::/16). */
static __always_inline int link_scope(const __u8 *a)
{
	return link_local(a) || (a[0] == 0xff && (a[1] & 0x0f) == 2);
}

/* neighbour_discovery says whether an ICMPv6 packet is the link's own
 * signalling, which IPv6 needs to work at all and no policy names.
 * Router and neighbour discovery as RFC 4861 allows it: hop limit 255 (so
 * it was not forwarded, and will not be), router solicitations from a
 * link-local source (or the unspecified one, to a link-scope destination),
 * advertisements and redirects from a link-local source, neighbour
 * solicitations and advertisements from a link-local or unspecified source
 * or to a link-scope destination. Multicast listener discovery as RFC 2710
 * and RFC 3810 allow it (a pod's kernel reports its groups when its device
 * comes up): hop limit 1 (never forwarded), from a link-local or
 * unspecified source, to a multicast group (a link-scope one for MLDv2
 * reports and MLDv1 done messages). A global source is checked
 * against the pod's device like any other. */
static __always_inline int neighbour_discovery(const struct pkt *p, const struct flow *f)
{
	if (p->family != 6 || p->protocol != IPPROTO_ICMPV6 || p->frag != FRAG_NONE)
		return 0;
	switch (f->icmp_type) {
	case 130: /* multicast listener query: to all nodes, or to the group */
	case 131: /* MLDv1 report: to the group */
		return p->hop_limit == 1 && (link_local(p->src) || unspecified(p->src)) && p->dst[0] == 0xff;
	case 132: /* MLDv1 done: to all routers (ff02::2) */
	case 143: /* MLDv2 report: to all MLDv2 routers (ff02::16) */
		return p->hop_limit == 1 && (link_local(p->src) || unspecified(p->src)) && p->dst[0] == 0xff &&
		       link_scope(p->dst);
	}
	if (p->hop_limit != 255)
		return 0;
	switch (f->icmp_type) {
	case 133: /* router solicitation */
		return link_local(p->src) || (unspecified(p->src) && link_scope(p->dst));
	case 134: /* router advertisement */
	case 137: /* redirect */
		return link_local(p->src);
	case 135: /* neighbour solicitation */
	case 136: /* neighbour advertisement */
		return link_local(p->src) || unspecified(p->src) || link_scope(p->dst);
	}
	return 0;
}

/* spoofed says whether the packet's source is forged: on the pod's egress,
 * a source that is not a pod address of this device; on its ingress, a
 * local pod's address on a packet that entered the node by another device.
 * BPF_PROG_TEST_RUN (the loopback device) checks neither. */
static __always_inline int spoofed(struct __sk_buff *skb, const struct pkt *p, int egress)
{
	__u32 dev;

	if (p->ifindex == LOOPBACK_IFINDEX)
		return 0;
	dev = pod_device(p, p->src);
	if (egress)
		return dev != p->ifindex;
	/* A packet the node itself sends has no ingress device. */
	return dev && p->ingress_ifindex && dev != p->ingress_ifindex;
}

static __always_inline int verdict(struct __sk_buff *skb, int egress, struct pkt *pp, struct flow *fp)
{
#define p (*pp)
#define f (*fp)
	struct ct_key ct = {};
	int ret, nd = 0;

	skb->cb[0] = REASON_MALFORMED;
	skb->cb[1] = NO_INTERVAL;
	skb->cb[2] = STEP_NONE;
	skb->cb[3] = 0;
	skb->cb[4] = 0;
	ret = parse(skb, &p);
	if (ret == PARSE_ARP) {
		skb->cb[0] = REASON_ARP;
		return VERDICT_PASS;
	}
	if (ret != PARSE_IP)
		return TC_ACT_SHOT;
	if (p.frag != FRAG_LATER && read_l4(skb, &p, &f))
		return TC_ACT_SHOT;

	nd = neighbour_discovery(&p, &f);
	if (!(nd && (link_local(p.src) || unspecified(p.src))) && spoofed(skb, &p, egress)) {
		skb->cb[0] = REASON_SPOOFED;
		return TC_ACT_SHOT;
	}
	if (nd) {
		skb->cb[0] = REASON_NEIGHBOR;
		return VERDICT_PASS;
	}
	if (p.frag == FRAG_LATER)
		return later_fragment(skb, &p);

	ct.family = p.family;
	ct.ifindex = p.ifindex;
	__builtin_memcpy(ct.pod, egress ? p.src : p.dst, 16);
	__builtin_memcpy(ct.peer, egress ? p.dst : p.src, 16);
	if (is_icmp_error(&p, &f) && icmp_related(skb, &p, egress)) {
		skb->cb[0] = REASON_TRACKED;
		ret = VERDICT_PASS;
	} else {
		ret = decide(skb, &p, &f, &ct, egress);
	}
	if (ret == VERDICT_PASS && p.frag == FRAG_FIRST)
		first_fragment_passed(skb, &p);
	return ret;
#undef p
#undef f
}

/* report puts a denied packet, or one audit mode passed, in
 * enimasq_policy_events when events are on. */
static __always_inline void report(struct __sk_buff *skb, const struct pkt *p, const struct flow *f, int egress)
{
	struct policy_event *e;

	if (!(mode() & MODE_EVENTS))
		return;
	e = bpf_ringbuf_reserve(&enimasq_policy_events, sizeof(*e), 0);
	if (!e)
		return;
	__builtin_memcpy(e->src, p->src, 16);
	__builtin_memcpy(e->dst, p->dst, 16);
	e->ifindex = skb->ifindex;
	e->object = skb->cb[3];
	e->sport = f->port_known ? f->sport : 0;
	e->dport = f->port_known ? f->port : 0;
	e->family = p->family;
	e->protocol = p->protocol;
	e->egress = egress;
	e->step = skb->cb[2];
	e->reason = skb->cb[0];
	e->flags = skb->cb[4];
	bpf_ringbuf_submit(e, 0);
}

static __always_inline int run(struct __sk_buff *skb, int egress)
{
	struct pkt p = {};
	struct flow f = {};
	int ret = verdict(skb, egress, &p, &f);

	if (ret == TC_ACT_SHOT || skb->cb[4] == AUDITED)
		report(skb, &p, &f, egress);
	return ret;
}

SEC("tc")
int policy_egress(struct __sk_buff *skb)
{
	return run(skb, 1);
}

SEC("tc")
int policy_ingress(struct __sk_buff *skb)
{
	return run(skb, 0);
}

char __license[] SEC("license") = "Dual BSD/GPL";
