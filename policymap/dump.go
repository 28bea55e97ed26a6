package policymap

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/prefixorder"
)

// ListPrefixes returns the prefixes in an LPM map with bpf's key layout
// (prefix length, then the address), sorted. Used by the script commands and
// enimasq-dbg, which read the kernel, not the table.
func ListPrefixes(m bpf.Map, fam bpf.Family) ([]netip.Prefix, error) {
	keys, err := bpf.Keys(m)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Prefix, 0, len(keys))
	for _, key := range keys {
		p, err := bpf.UnmarshalKey(fam, key)
		if err != nil {
			return nil, fmt.Errorf("map key % x: %w", key, err)
		}
		out = append(out, p)
	}
	slices.SortFunc(out, prefixorder.Compare)
	return out, nil
}
