package ipmasq

import "net/netip"

// DefaultNonMasqCIDRs are used when the config file is missing: the
// reserved IPv4 ranges, as in Cilium and kubernetes-sigs/ip-masq-agent.
// There are no IPv6 defaults.
var DefaultNonMasqCIDRs = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("192.88.99.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// Link-local ranges, exempt from masquerading unless masqLinkLocal /
// masqLinkLocalIPv6 is true.
var (
	LinkLocalV4 = netip.MustParsePrefix("169.254.0.0/16")
	LinkLocalV6 = netip.MustParsePrefix("fe80::/10")
)

// MaxCIDRsPerFamily is what one family's BPF map holds (cilium_ipmasq_v4 /
// _v6 have 16384 entries); link-local counts.
const MaxCIDRsPerFamily = 16384

// MaxFileSize bounds the config file.
const MaxFileSize = 1 << 20
