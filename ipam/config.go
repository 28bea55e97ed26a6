package ipam

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/enimasq/enimasq/cells/retryflags"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/ipam/allocator"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipam/datapath"
	"github.com/enimasq/enimasq/ipam/podset"
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
	CiliumNodePath:          ciliumnode.DefaultPath,
	CiliumNodeResync:        60 * time.Second,
	CiliumNodeLossGrace:     30 * time.Second,
	ENIEgressRuleMode:       datapath.EgressModeCIDR,
	ENINetlinkRetryMin:      100 * time.Millisecond,
	ENINetlinkRetryMax:      time.Minute,
	ENINetlinkRefreshPeriod: 5 * time.Minute,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("ciliumnode-path", def.CiliumNodePath, "CiliumNode file of this node (YAML or JSON, as kubectl get ciliumnode NODE -o yaml prints it); its directory is watched. With the Kubernetes API server enabled, the CiliumNode named after the node is read from it instead, and setting this flag is an error")
	flags.Duration("ciliumnode-resync-interval", def.CiliumNodeResync, "Re-read the CiliumNode file this often, in case a file event was missed")
	flags.Duration("ciliumnode-loss-grace", def.CiliumNodeLossGrace, "Keep an ENI, or pool IPs of one, that leave the CiliumNode this long before their pods' rules and routes go (a CiliumNode briefly cut short costs no running pod its rules); 0: at once")
	flags.String("eni-egress-rule-mode", def.ENIEgressRuleMode, `Pod egress ip rules: "cidr" (one rule per CIDR of the allocation result) or "all" (one rule for all destinations)`)
	retryflags.Declare(flags, "eni-netlink", "ip rule or route", "Re-add every ip rule and route and delete unknown ones of enimasq's protocol",
		def.netlinkRetry())
}

// netlinkRetry are the rule and route reconcilers' retry and refresh flags.
func (c Config) netlinkRetry() retryflags.Values {
	return retryflags.Values{RetryMin: c.ENINetlinkRetryMin, RetryMax: c.ENINetlinkRetryMax, Refresh: c.ENINetlinkRefreshPeriod}
}

// Settings are the settings of the parts, from the flags and the node's
// config: who allocates decides which parts run and what of a pod's
// datapath is enimasq's.
type Settings struct {
	// Off, when set, says why the ENI IPAM does nothing: linked into Cilium
	// with an IPAM mode other than ENI. Its tables exist, are initialized
	// and stay empty.
	Off string

	CiliumNode ciliumnode.Settings
	Allocator  allocator.Settings
	PodSet     podset.Settings
	Datapath   datapath.Settings
}

// partSettings are Settings as the parts take them.
type partSettings struct {
	cell.Out

	CiliumNode ciliumnode.Settings
	Allocator  allocator.Settings
	PodSet     podset.Settings
	Datapath   datapath.Settings
}

func newPartSettings(c Config, node nodeconfig.Config) (partSettings, error) {
	s, err := NewSettings(c, node)
	return partSettings{CiliumNode: s.CiliumNode, Allocator: s.Allocator, PodSet: s.PodSet, Datapath: s.Datapath}, err
}

// NewSettings validates the flags against the node's config. Errors name the
// flag.
func NewSettings(c Config, node nodeconfig.Config) (Settings, error) {
	if err := validate(c); err != nil {
		return Settings{}, err
	}
	if node.IPAM.Mode != IPAMModeENI {
		if node.IPAM.Allocator != nodeconfig.AllocatorCilium {
			return Settings{}, fmt.Errorf("--ipam %q is not supported: the only IPAM mode is %q", node.IPAM.Mode, IPAMModeENI)
		}
		// Linked into Cilium with another IPAM mode: no ENI pods.
		off := fmt.Sprintf("IPAM mode is %q, not %q", node.IPAM.Mode, IPAMModeENI)
		return Settings{
			Off:        off,
			CiliumNode: ciliumnode.Settings{Off: off},
			Allocator:  allocator.Settings{Off: off},
			PodSet:     podset.Settings{Off: off},
			Datapath:   datapath.Settings{Off: off},
		}, nil
	}
	routing := []netip.Prefix{node.IPAM.IPv4NativeRoutingCIDR, node.IPAM.IPv6NativeRoutingCIDR}
	s := Settings{
		CiliumNode: ciliumnode.Settings{Path: c.CiliumNodePath, Resync: c.CiliumNodeResync, LossGrace: c.CiliumNodeLossGrace},
		Allocator: allocator.Settings{
			EnableIPv4: node.EnableIPv4, EnableIPv6: node.EnableIPv6, NativeRouting: routing,
			CiliumNodeSource: c.CiliumNodePath, CiliumNodeResync: c.CiliumNodeResync,
		},
		Datapath: datapath.Settings{
			EgressMode:    c.ENIEgressRuleMode,
			NativeRouting: routing,
			// One rule per CIDR while the family is masqueraded, by BPF or
			// by iptables: cilium-cni decides on --enable-ipv4/6-masquerade
			// alone.
			MasqueradeV4:  node.Masquerade.IPv4,
			MasqueradeV6:  node.Masquerade.IPv6,
			EnableIPv4:    node.EnableIPv4,
			EnableIPv6:    node.EnableIPv6,
			PodRules:      node.IPAM.PodRules,
			RetryMin:      c.ENINetlinkRetryMin,
			RetryMax:      c.ENINetlinkRetryMax,
			RefreshPeriod: c.ENINetlinkRefreshPeriod,
		},
	}
	if s.Datapath.PodRules == (nodeconfig.PodRules{}) {
		s.Datapath.PodRules = nodeconfig.EnimasqPodRules
	}
	switch node.IPAM.Allocator {
	case "", nodeconfig.AllocatorEnimasq:
		// enimasq allocates, and writes every rule and route of its pods
		// with a protocol of its own.
		s.PodSet.Off = "enimasq's allocator allocates"
		s.Datapath.IngressRules, s.Datapath.Routes = true, true
	case nodeconfig.AllocatorCilium:
		// Cilium allocates; cilium-cni writes a pod's rules at ADD (and
		// the agent at endpoint restore), its routes and its ingress rule:
		// enimasq keeps the egress rules in step, in cilium-cni's shape, or
		// the two would undo each other.
		if c.ENIEgressRuleMode != datapath.EgressModeCIDR {
			return Settings{}, fmt.Errorf("--eni-egress-rule-mode %q: linked into Cilium, the pod rules are cilium-cni's shape (%q); "+
				"Cilium would put its per-CIDR rules back at every endpoint restore", c.ENIEgressRuleMode, datapath.EgressModeCIDR)
		}
		s.Allocator.Off = "the embedding agent's IPAM allocates"
		s.Datapath.SharedProtocol = true
	default:
		return Settings{}, fmt.Errorf("pod IP allocator %q: want %q or %q", node.IPAM.Allocator, nodeconfig.AllocatorEnimasq, nodeconfig.AllocatorCilium)
	}
	return s, nil
}

// validate checks the flags on their own.
func validate(c Config) error {
	switch c.ENIEgressRuleMode {
	case datapath.EgressModeCIDR, datapath.EgressModeAll:
	default:
		return fmt.Errorf("--eni-egress-rule-mode %q: want %q or %q", c.ENIEgressRuleMode, datapath.EgressModeCIDR, datapath.EgressModeAll)
	}
	switch {
	case c.CiliumNodePath == "":
		return fmt.Errorf("--ciliumnode-path must not be empty")
	case c.CiliumNodeLossGrace < 0:
		return fmt.Errorf("--ciliumnode-loss-grace %s: must not be negative", c.CiliumNodeLossGrace)
	case c.CiliumNodeResync <= 0:
		return fmt.Errorf("--ciliumnode-resync-interval %s: must be positive", c.CiliumNodeResync)
	case c.netlinkRetry().Validate("eni-netlink") != nil:
		return c.netlinkRetry().Validate("eni-netlink")
	}
	return nil
}
