// Package nodeconfig holds the settings that the agent enimasq is linked into
// owns, and that every enimasq feature cell reads: which IP families the node
// runs, where BPF objects are pinned and state is kept, whether and how
// traffic is masqueraded, the ip-masq-agent switch and file, the IPAM mode and
// the native-routing CIDR.
//
// They are plain values with no dependencies and no flags, so that each
// setting has one flag in the process: the standalone enimasq-agent fills
// them from its flags (cells/infra, with Cilium's flag names), a Cilium build
// from Cilium's own configuration (cmd/cilium-agent), so that Cilium's flags
// toggle enimasq there. Flags that only enimasq has stay with the feature
// cells.
package nodeconfig

import (
	"errors"
	"net/netip"
	"path/filepath"
)

// Config is the node-wide configuration.
type Config struct {
	// EnableIPv4 and EnableIPv6 say which families the node runs. Feature
	// cells program nothing for a disabled family.
	EnableIPv4 bool
	EnableIPv6 bool

	// BPFRoot is the bpffs mount under which maps are pinned
	// (<BPFRoot>/tc/globals/<map>).
	BPFRoot string

	// StateDir holds sockets and checkpoints.
	StateDir string

	// Masquerade says whether traffic leaving the node is masqueraded.
	Masquerade Masquerade

	// IPMasqAgent is the ip-masq-agent: the source of the non-masquerade
	// CIDRs.
	IPMasqAgent IPMasqAgent

	// IPAM is the node's IP address management.
	IPAM IPAM
}

// Masquerade is Cilium's --enable-bpf-masquerade and
// --enable-ipv4/ipv6-masquerade.
type Masquerade struct {
	BPF  bool
	IPv4 bool
	IPv6 bool
}

// V4 and V6 say whether BPF masquerading is on for the family: only then
// does the ip-masq-agent (and the per-CIDR egress rule) matter.
func (m Masquerade) V4() bool { return m.BPF && m.IPv4 }
func (m Masquerade) V6() bool { return m.BPF && m.IPv6 }

// IPMasqAgent is Cilium's --enable-ip-masq-agent and
// --ip-masq-agent-config-path. (The period of the safety-net re-read is
// enimasq's own flag, of the ipmasq cell.)
type IPMasqAgent struct {
	Enabled    bool
	ConfigPath string
}

// DefaultIPMasqAgentConfigPath is Cilium's --ip-masq-agent-config-path
// default (a ConfigMap mount).
const DefaultIPMasqAgentConfigPath = "/etc/config/ip-masq-agent"

// Validate refuses, as Cilium does, an ip-masq-agent without BPF
// masquerading, naming the missing flag.
func (a IPMasqAgent) Validate(masq Masquerade) error {
	if !a.Enabled {
		return nil
	}
	switch {
	case !masq.BPF:
		return errors.New("--enable-ip-masq-agent needs --enable-bpf-masquerade")
	case !masq.IPv4 && !masq.IPv6:
		return errors.New("--enable-ip-masq-agent needs --enable-ipv4-masquerade or --enable-ipv6-masquerade")
	case a.ConfigPath == "":
		return errors.New("--enable-ip-masq-agent needs --ip-masq-agent-config-path")
	}
	return nil
}

// IPAM modes (Cilium's --ipam). The ENI cells act only in IPAMModeENI.
const IPAMModeENI = "eni"

// Pod IP allocators: who hands out pod IPs and writes a pod's ip rules when
// it is created.
const (
	// AllocatorEnimasq: enimasq's own ENI allocator and CNI plugin
	// (standalone). enimasq owns the pod rules and routes, tagged with its
	// own netlink protocol.
	AllocatorEnimasq = "enimasq"
	// AllocatorCilium: Cilium's IPAM and cilium-cni (the Cilium build).
	// cilium-cni writes each pod's rules at ADD; enimasq keeps their egress
	// rules in step with the ip-masq-agent CIDRs, in Cilium's own shape
	// (PodRules), and leaves Cilium's routes alone.
	AllocatorCilium = "cilium"
)

// IPAM is the node's IP address management.
type IPAM struct {
	// Mode is Cilium's --ipam.
	Mode string

	// Allocator is AllocatorEnimasq or AllocatorCilium.
	Allocator string

	// IPv4NativeRoutingCIDR and IPv6NativeRoutingCIDR are reached without
	// masquerading: each is one of the CIDRs of every pod's egress rules of
	// its family. Invalid when unset.
	IPv4NativeRoutingCIDR netip.Prefix
	IPv6NativeRoutingCIDR netip.Prefix

	// PodRules is the shape of the pod ip rules enimasq writes and prunes.
	PodRules PodRules
}

// PodRules is the shape of a pod's ENI ip rules.
type PodRules struct {
	// IngressPriority: "<prio>: to <pod> lookup main".
	IngressPriority int
	// EgressPriority: "<prio>: from <pod> [to <cidr>] lookup <table>".
	EgressPriority int
	// TableOffset: the egress table is TableOffset + the ENI's number.
	TableOffset int
	// Protocol tags the rules (and routes) enimasq writes; pruning only ever
	// looks at rules of this protocol.
	Protocol int
}

// The shape of enimasq's own pod rules (AllocatorEnimasq): Cilium's
// priorities and tables, with the project's own netlink protocol number, so
// that pruning never touches another writer's rules.
var EnimasqPodRules = PodRules{
	IngressPriority: 20,
	EgressPriority:  111,
	TableOffset:     10,
	Protocol:        237,
}

// FamilyEnabled reports whether the family of addr is enabled on the node.
func (c Config) FamilyEnabled(addr netip.Addr) bool {
	if addr.Is4() || addr.Is4In6() {
		return c.EnableIPv4
	}
	return addr.Is6() && c.EnableIPv6
}

// GlobalsDir is where Cilium-compatible maps are pinned.
func (c Config) GlobalsDir() string {
	return filepath.Join(c.BPFRoot, "tc", "globals")
}
