package bpf

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
)

// KeyValue is a map entry as the kernel holds it.
type KeyValue struct {
	Key, Value []byte
}

// Entries returns every entry of a map, keys and values, for a reader that
// takes over what an earlier run left (policy versions adopted at
// restart). Like listKeys, it uses batch lookups where the kernel has them,
// walks the keys otherwise, and fails rather than return more entries than
// the map holds.
func Entries(m PinnedMap) ([]KeyValue, error) {
	limit := int(m.MaxEntries())
	var out []KeyValue
	err := batchList(m, func(keys, values batchBuf, n int) error {
		for i := range n {
			out = append(out, KeyValue{slices.Clone(keys.at(i)), slices.Clone(values.at(i))})
		}
		if len(out) > limit {
			return fmt.Errorf("list entries: more than the %d entries the map holds", limit)
		}
		return nil
	})
	if errors.Is(err, ebpf.ErrNotSupported) {
		return walkEntries(m, limit)
	}
	return out, err
}

// walkEntries lists the entries one key at a time.
func walkEntries(m PinnedMap, limit int) ([]KeyValue, error) {
	keys, err := walkKeys(m, limit)
	if err != nil {
		return nil, err
	}
	out := make([]KeyValue, 0, keys.len())
	for i := range keys.len() {
		k := slices.Clone(keys.at(i))
		v := make([]byte, m.ValueSize())
		switch err := m.Lookup(k, v); {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			continue // deleted meanwhile
		case err != nil:
			return nil, fmt.Errorf("list entries: %w", err)
		}
		out = append(out, KeyValue{k, v})
	}
	return out, nil
}
