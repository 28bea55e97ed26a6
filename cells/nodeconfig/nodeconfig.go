// Package nodeconfig holds the node-wide settings that every enimasq feature
// cell reads: which IP families the node runs, where BPF objects are pinned,
// and where state is kept. It is a plain value with no dependencies so that an
// agent embedding the feature cells can provide it from its own configuration
// (as a Cilium-based agent would from its DaemonConfig), without linking
// enimasq's infrastructure cells.
package nodeconfig

import (
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
