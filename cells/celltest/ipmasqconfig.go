package celltest

import (
	"fmt"
	"net/netip"
	"strings"
)

// IPMasqAgentConfig is an ip-masq-agent config with n IPv4 /32s
// (10.0.0.0, 10.0.0.1, ...) and the extra CIDRs, for the benchmarks of
// large files.
func IPMasqAgentConfig(n int, extra ...string) string {
	var b strings.Builder
	b.WriteString("nonMasqueradeCIDRs:\n")
	for i := range n {
		fmt.Fprintf(&b, "- %s/32\n", netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
	}
	for _, e := range extra {
		fmt.Fprintf(&b, "- %s\n", e)
	}
	return b.String()
}
