package ciliumlink

import (
	"fmt"
	"net/netip"
	"path/filepath"

	"golang.org/x/sys/unix"

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
		bpfRoot = defaultBPFRoot()
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

// defaultBPFRoot is where Cilium mounts the bpffs without --bpf-root:
// /sys/fs/bpf, or /run/cilium/bpffs when /sys/fs/bpf is not a bpffs
// (pkg/bpf checkOrMountFS). It is found by looking, not by asking pkg/bpf:
// reading its root locks it, and the hive is built before Cilium mounts.
func defaultBPFRoot() string {
	var st unix.Statfs_t
	if err := unix.Statfs(defaults.BPFFSRoot, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		if err := unix.Statfs(defaults.BPFFSRootFallback, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
			return defaults.BPFFSRootFallback
		}
	}
	return defaults.BPFFSRoot
}
