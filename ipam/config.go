package ipam

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/ipmasq"
)

// Egress rule modes (--eni-egress-rule-mode).
const (
	// EgressModeCIDR: one priority-111 rule per pod and CIDR of the
	// allocation result, as Cilium does with masquerading on.
	EgressModeCIDR = "cidr"
	// EgressModeAll: one priority-111 rule per pod for all destinations
	// (upstream's answer to cilium#45137).
	EgressModeAll = "all"
)

// IPAMModeENI is the only IPAM mode (--ipam).
const IPAMModeENI = "eni"

// Config holds the ENI IPAM flags, with Cilium's names where Cilium has them.
type Config struct {
	IPAM                    string        `mapstructure:"ipam"`
	CiliumNodePath          string        `mapstructure:"ciliumnode-path"`
	CiliumNodeResync        time.Duration `mapstructure:"ciliumnode-resync-interval"`
	IPv4NativeRoutingCIDR   string        `mapstructure:"ipv4-native-routing-cidr"`
	ENIEgressRuleMode       string        `mapstructure:"eni-egress-rule-mode"`
	ENINetlinkRetryMin      time.Duration `mapstructure:"eni-netlink-retry-min"`
	ENINetlinkRetryMax      time.Duration `mapstructure:"eni-netlink-retry-max"`
	ENINetlinkRefreshPeriod time.Duration `mapstructure:"eni-netlink-refresh-interval"`
}

// DefaultConfig is the default ENI IPAM configuration.
var DefaultConfig = Config{
	IPAM:                    IPAMModeENI,
	CiliumNodePath:          "/etc/config/ciliumnode",
	CiliumNodeResync:        60 * time.Second,
	IPv4NativeRoutingCIDR:   "",
	ENIEgressRuleMode:       EgressModeCIDR,
	ENINetlinkRetryMin:      100 * time.Millisecond,
	ENINetlinkRetryMax:      time.Minute,
	ENINetlinkRefreshPeriod: 5 * time.Minute,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("ipam", def.IPAM, `IP address management mode; only "eni" (AWS ENI, from the CiliumNode file) is supported`)
	flags.String("ciliumnode-path", def.CiliumNodePath, "CiliumNode file of this node (YAML or JSON, as kubectl get ciliumnode NODE -o yaml prints it); its directory is watched. With the Kubernetes API server enabled, the CiliumNode named after the node is read from it instead, and setting this flag is an error")
	flags.Duration("ciliumnode-resync-interval", def.CiliumNodeResync, "Re-read the CiliumNode file this often, in case a file event was missed")
	flags.String("ipv4-native-routing-cidr", def.IPv4NativeRoutingCIDR, "CIDR reachable without masquerading, added to the CIDRs of every IPv4 allocation")
	flags.String("eni-egress-rule-mode", def.ENIEgressRuleMode, `Pod egress ip rules: "cidr" (one rule per CIDR of the allocation result) or "all" (one rule for all destinations)`)
	flags.Duration("eni-netlink-retry-min", def.ENINetlinkRetryMin, "Backoff before the first retry of a failed ip rule or route")
	flags.Duration("eni-netlink-retry-max", def.ENINetlinkRetryMax, "Longest backoff between retries of a failed ip rule or route")
	flags.Duration("eni-netlink-refresh-interval", def.ENINetlinkRefreshPeriod, "Re-add every ip rule and route and delete unknown ones of enimasq's protocol this often (drift repair)")
}

// Settings are the validated flags the desired-state computation needs.
type Settings struct {
	// EgressMode is EgressModeCIDR or EgressModeAll.
	EgressMode string
	// NativeRoutingCIDR is --ipv4-native-routing-cidr (invalid when unset).
	NativeRoutingCIDR netip.Prefix
	// MasqueradeV4 and MasqueradeV6: masquerading is on for the family
	// (--enable-bpf-masquerade and --enable-ipv4/6-masquerade). With it off,
	// the egress rule is one rule for all destinations, as in Cilium.
	MasqueradeV4, MasqueradeV6 bool
	// EnableIPv4 and EnableIPv6 are the families the node runs.
	EnableIPv4, EnableIPv6 bool
}

// Masquerade says whether masquerading is on for the family of addr.
func (s Settings) Masquerade(addr netip.Addr) bool {
	if addr.Is4() {
		return s.MasqueradeV4
	}
	return s.MasqueradeV6
}

// FamilyEnabled says whether the node runs the family of addr.
func (s Settings) FamilyEnabled(addr netip.Addr) bool {
	if addr.Is4() {
		return s.EnableIPv4
	}
	return s.EnableIPv6
}

// NewSettings validates the flags. Errors name the flag.
func NewSettings(c Config, masq ipmasq.Config, node nodeconfig.Config) (Settings, error) {
	if c.IPAM != IPAMModeENI {
		return Settings{}, fmt.Errorf("--ipam %q is not supported: the only IPAM mode is %q", c.IPAM, IPAMModeENI)
	}
	s := Settings{
		EgressMode:   c.ENIEgressRuleMode,
		MasqueradeV4: masq.EnableBPFMasquerade && masq.EnableIPv4Masquerade,
		MasqueradeV6: masq.EnableBPFMasquerade && masq.EnableIPv6Masquerade,
		EnableIPv4:   node.EnableIPv4,
		EnableIPv6:   node.EnableIPv6,
	}
	switch c.ENIEgressRuleMode {
	case EgressModeCIDR, EgressModeAll:
	default:
		return Settings{}, fmt.Errorf("--eni-egress-rule-mode %q: want %q or %q", c.ENIEgressRuleMode, EgressModeCIDR, EgressModeAll)
	}
	if c.IPv4NativeRoutingCIDR != "" {
		p, err := netip.ParsePrefix(strings.TrimSpace(c.IPv4NativeRoutingCIDR))
		if err != nil || !p.Addr().Is4() {
			return Settings{}, fmt.Errorf("--ipv4-native-routing-cidr %q: not an IPv4 CIDR", c.IPv4NativeRoutingCIDR)
		}
		if p.Masked() != p {
			return Settings{}, fmt.Errorf("--ipv4-native-routing-cidr %q: host bits set (did you mean %s?)", c.IPv4NativeRoutingCIDR, p.Masked())
		}
		s.NativeRoutingCIDR = p
	}
	switch {
	case c.CiliumNodePath == "":
		return Settings{}, fmt.Errorf("--ciliumnode-path must not be empty")
	case c.CiliumNodeResync <= 0:
		return Settings{}, fmt.Errorf("--ciliumnode-resync-interval %s: must be positive", c.CiliumNodeResync)
	case c.ENINetlinkRetryMin <= 0 || c.ENINetlinkRetryMax < c.ENINetlinkRetryMin:
		return Settings{}, fmt.Errorf("--eni-netlink-retry-min %s and --eni-netlink-retry-max %s: want 0 < min <= max", c.ENINetlinkRetryMin, c.ENINetlinkRetryMax)
	case c.ENINetlinkRefreshPeriod <= 0:
		return Settings{}, fmt.Errorf("--eni-netlink-refresh-interval %s: must be positive", c.ENINetlinkRefreshPeriod)
	}
	return s, nil
}
