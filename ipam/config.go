package ipam

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/cells/nodeconfig"
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

// IPAMModeENI is the only IPAM mode enimasq's ENI cells act in (--ipam).
const IPAMModeENI = nodeconfig.IPAMModeENI

// Config holds the flags that only enimasq's ENI IPAM has. The IPAM mode and
// the native-routing CIDR are settings of the embedding agent
// (nodeconfig.IPAM).
type Config struct {
	CiliumNodePath          string        `mapstructure:"ciliumnode-path"`
	CiliumNodeResync        time.Duration `mapstructure:"ciliumnode-resync-interval"`
	CiliumNodeLossGrace     time.Duration `mapstructure:"ciliumnode-loss-grace"`
	ENIEgressRuleMode       string        `mapstructure:"eni-egress-rule-mode"`
	ENINetlinkRetryMin      time.Duration `mapstructure:"eni-netlink-retry-min"`
	ENINetlinkRetryMax      time.Duration `mapstructure:"eni-netlink-retry-max"`
	ENINetlinkRefreshPeriod time.Duration `mapstructure:"eni-netlink-refresh-interval"`
}

// DefaultConfig is the default ENI IPAM configuration.
var DefaultConfig = Config{
	CiliumNodePath:          "/etc/config/ciliumnode",
	CiliumNodeResync:        60 * time.Second,
	CiliumNodeLossGrace:     30 * time.Second,
	ENIEgressRuleMode:       EgressModeCIDR,
	ENINetlinkRetryMin:      100 * time.Millisecond,
	ENINetlinkRetryMax:      time.Minute,
	ENINetlinkRefreshPeriod: 5 * time.Minute,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("ciliumnode-path", def.CiliumNodePath, "CiliumNode file of this node (YAML or JSON, as kubectl get ciliumnode NODE -o yaml prints it); its directory is watched. With the Kubernetes API server enabled, the CiliumNode named after the node is read from it instead, and setting this flag is an error")
	flags.Duration("ciliumnode-resync-interval", def.CiliumNodeResync, "Re-read the CiliumNode file this often, in case a file event was missed")
	flags.Duration("ciliumnode-loss-grace", def.CiliumNodeLossGrace, "Keep an ENI, or pool IPs of one, that leave the CiliumNode this long before their pods' rules and routes go (a CiliumNode briefly cut short costs no running pod its rules); 0: at once")
	flags.String("eni-egress-rule-mode", def.ENIEgressRuleMode, `Pod egress ip rules: "cidr" (one rule per CIDR of the allocation result) or "all" (one rule for all destinations)`)
	flags.Duration("eni-netlink-retry-min", def.ENINetlinkRetryMin, "Backoff before the first retry of a failed ip rule or route")
	flags.Duration("eni-netlink-retry-max", def.ENINetlinkRetryMax, "Longest backoff between retries of a failed ip rule or route")
	flags.Duration("eni-netlink-refresh-interval", def.ENINetlinkRefreshPeriod, "Re-add every ip rule and route and delete unknown ones of enimasq's protocol this often (drift repair)")
}

// Settings are the validated flags the desired-state computation needs.
type Settings struct {
	// Off, when set, says why the ENI IPAM does nothing: linked into Cilium
	// with an IPAM mode other than ENI. Its tables exist, are initialized
	// and stay empty.
	Off string

	// EgressMode is EgressModeCIDR or EgressModeAll.
	EgressMode string
	// NativeRoutingCIDR and NativeRoutingCIDRv6 are
	// --ipv4/ipv6-native-routing-cidr (invalid when unset).
	NativeRoutingCIDR, NativeRoutingCIDRv6 netip.Prefix
	// MasqueradeV4 and MasqueradeV6: the family is masqueraded
	// (--enable-ipv4/6-masquerade, in BPF or by iptables), as cilium-cni
	// decides. With it off, the egress rule is one rule for all
	// destinations, as in Cilium.
	MasqueradeV4, MasqueradeV6 bool
	// EnableIPv4 and EnableIPv6 are the families the node runs.
	EnableIPv4, EnableIPv6 bool
	// Allocator is who hands out pod IPs and writes their rules at ADD:
	// nodeconfig.AllocatorEnimasq or nodeconfig.AllocatorCilium.
	Allocator string
	// PodRules is the shape (priorities, table offset, protocol) of the
	// pod rules.
	PodRules nodeconfig.PodRules
}

// OwnsAllocations says whether enimasq's own allocator (and its CNI API,
// checkpoint and ENI routes) runs, rather than Cilium's IPAM.
func (s Settings) OwnsAllocations() bool { return s.Allocator != nodeconfig.AllocatorCilium }

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
func NewSettings(c Config, node nodeconfig.Config) (Settings, error) {
	if node.IPAM.Mode != IPAMModeENI {
		if node.IPAM.Allocator == nodeconfig.AllocatorCilium {
			// Linked into Cilium with another IPAM mode: no ENI pods.
			return Settings{Off: fmt.Sprintf("IPAM mode is %q, not %q", node.IPAM.Mode, IPAMModeENI), Allocator: node.IPAM.Allocator}, nil
		}
		return Settings{}, fmt.Errorf("--ipam %q is not supported: the only IPAM mode is %q", node.IPAM.Mode, IPAMModeENI)
	}
	s := Settings{
		EgressMode:          c.ENIEgressRuleMode,
		NativeRoutingCIDR:   node.IPAM.IPv4NativeRoutingCIDR,
		NativeRoutingCIDRv6: node.IPAM.IPv6NativeRoutingCIDR,
		// One rule per CIDR while the family is masqueraded, by BPF or by
		// iptables: cilium-cni decides on --enable-ipv4/6-masquerade alone.
		MasqueradeV4: node.Masquerade.IPv4,
		MasqueradeV6: node.Masquerade.IPv6,
		EnableIPv4:   node.EnableIPv4,
		EnableIPv6:   node.EnableIPv6,
		Allocator:    node.IPAM.Allocator,
		PodRules:     node.IPAM.PodRules,
	}
	switch s.Allocator {
	case "":
		s.Allocator = nodeconfig.AllocatorEnimasq
	case nodeconfig.AllocatorEnimasq:
	case nodeconfig.AllocatorCilium:
		// The rules must be the ones cilium-cni writes at ADD (and the agent
		// at endpoint restore), or the two would undo each other.
		if c.ENIEgressRuleMode != EgressModeCIDR {
			return Settings{}, fmt.Errorf("--eni-egress-rule-mode %q: linked into Cilium, the pod rules are cilium-cni's shape (%q); "+
				"Cilium would put its per-CIDR rules back at every endpoint restore", c.ENIEgressRuleMode, EgressModeCIDR)
		}
	default:
		return Settings{}, fmt.Errorf("pod IP allocator %q: want %q or %q", s.Allocator, nodeconfig.AllocatorEnimasq, nodeconfig.AllocatorCilium)
	}
	if s.PodRules == (nodeconfig.PodRules{}) {
		s.PodRules = nodeconfig.EnimasqPodRules
	}
	switch c.ENIEgressRuleMode {
	case EgressModeCIDR, EgressModeAll:
	default:
		return Settings{}, fmt.Errorf("--eni-egress-rule-mode %q: want %q or %q", c.ENIEgressRuleMode, EgressModeCIDR, EgressModeAll)
	}
	switch {
	case c.CiliumNodePath == "":
		return Settings{}, fmt.Errorf("--ciliumnode-path must not be empty")
	case c.CiliumNodeLossGrace < 0:
		return Settings{}, fmt.Errorf("--ciliumnode-loss-grace %s: must not be negative", c.CiliumNodeLossGrace)
	case c.CiliumNodeResync <= 0:
		return Settings{}, fmt.Errorf("--ciliumnode-resync-interval %s: must be positive", c.CiliumNodeResync)
	case c.ENINetlinkRetryMin <= 0 || c.ENINetlinkRetryMax < c.ENINetlinkRetryMin:
		return Settings{}, fmt.Errorf("--eni-netlink-retry-min %s and --eni-netlink-retry-max %s: want 0 < min <= max", c.ENINetlinkRetryMin, c.ENINetlinkRetryMax)
	case c.ENINetlinkRefreshPeriod <= 0:
		return Settings{}, fmt.Errorf("--eni-netlink-refresh-interval %s: must be positive", c.ENINetlinkRefreshPeriod)
	}
	return s, nil
}
