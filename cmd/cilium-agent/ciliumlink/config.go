package ciliumlink

import (
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/cilium/cilium/pkg/bpf"
	"github.com/cilium/cilium/pkg/datapath/linux/linux_defaults"
	"github.com/cilium/cilium/pkg/defaults"
	ipmasqcell "github.com/cilium/cilium/pkg/ipmasq/cell"
	"github.com/cilium/cilium/pkg/option"

	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// StateSubdir is enimasq's directory under Cilium's --state-dir.
const StateSubdir = "enimasq"

// CiliumPodRules is the shape of the pod rules that Cilium v1.20.2's
// RoutingInfo.Configure writes in ENI mode (pkg/datapath/linux/routing):
// ingress at RulePriorityIngress into main, egress at RulePriorityEgressv2
// into RouteTableInterfacesOffset + the ENI number, protocol RTProto
// (RTPROT_KERNEL). The compat priority (RulePriorityEgress, table = ifindex)
// is Azure's only.
var CiliumPodRules = nodeconfig.PodRules{
	IngressPriority: linux_defaults.RulePriorityIngress,
	EgressPriority:  linux_defaults.RulePriorityEgressv2,
	TableOffset:     linux_defaults.RouteTableInterfacesOffset,
	Protocol:        int(linux_defaults.RTProto),
}

// newNodeConfig is enimasq's node configuration from Cilium's. ipMasq is
// Cilium's ip-masq-agent cell config as decorated here (its switch is off:
// Cilium's writer does not run), so the switch is read from
// option.Config.EnableIPMasqAgent, which --enable-ip-masq-agent sets.
func newNodeConfig(dc *option.DaemonConfig, ipMasq ipmasqcell.Config) (nodeconfig.Config, error) {
	bpfRoot := dc.BPFRoot
	if bpfRoot == "" {
		// Where Cilium mounted the bpffs (initEnv has run when the hive is
		// built): /sys/fs/bpf, or /run/cilium/bpffs when that is not one.
		bpfRoot = bpf.BPFFSRoot()
	}
	stateDir := dc.StateDir
	if stateDir == "" {
		stateDir = defaults.RuntimePath
	}
	cfg := nodeconfig.Config{
		EnableIPv4: dc.EnableIPv4,
		EnableIPv6: dc.EnableIPv6,
		BPFRoot:    bpfRoot,
		StateDir:   filepath.Join(stateDir, StateSubdir),
		Masquerade: nodeconfig.Masquerade{
			BPF:  dc.EnableBPFMasquerade,
			IPv4: dc.EnableIPv4Masquerade,
			IPv6: dc.EnableIPv6Masquerade,
		},
		IPMasqAgent: nodeconfig.IPMasqAgent{
			Enabled:    dc.EnableIPMasqAgent,
			ConfigPath: ipMasq.IPMasqAgentConfigPath,
		},
		IPAM: nodeconfig.IPAM{
			Mode:      dc.IPAMMode(),
			Allocator: nodeconfig.AllocatorCilium,
			PodRules:  CiliumPodRules,
		},
	}
	if c := dc.IPv4NativeRoutingCIDR; c != nil && c.IPNet != nil {
		p, err := netip.ParsePrefix(c.String())
		if err != nil {
			return nodeconfig.Config{}, fmt.Errorf("--%s %s: %w", option.IPv4NativeRoutingCIDR, c, err)
		}
		cfg.IPAM.IPv4NativeRoutingCIDR = p.Masked()
	}
	if c := dc.IPv6NativeRoutingCIDR; c != nil && c.IPNet != nil {
		p, err := netip.ParsePrefix(c.String())
		if err != nil {
			return nodeconfig.Config{}, fmt.Errorf("--%s %s: %w", option.IPv6NativeRoutingCIDR, c, err)
		}
		cfg.IPAM.IPv6NativeRoutingCIDR = p.Masked()
	}
	return cfg, nil
}
