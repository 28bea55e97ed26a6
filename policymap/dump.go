package policymap

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
)

// ListPrefixes returns the prefixes in an LPM map with bpf's key layout
// (prefix length, then the address), sorted. Used by the script commands and
// enimasq-dbg, which read the kernel, not the table.
func ListPrefixes(m *ebpf.Map, fam bpf.Family) ([]netip.Prefix, error) {
	var out []netip.Prefix
	key := make([]byte, m.KeySize())
	value := make([]byte, m.ValueSize())
	iter := m.Iterate()
	for iter.Next(&key, &value) {
		p, err := bpf.UnmarshalKey(fam, key)
		if err != nil {
			return nil, fmt.Errorf("map key % x: %w", key, err)
		}
		out = append(out, p)
	}
	if err := iter.Err(); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, err
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out, nil
}
