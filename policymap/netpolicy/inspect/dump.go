package inspect

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/prefixorder"
)

// KernelPolicyEntry is one entry of a policy map as the kernel holds it,
// decoded. Used by the script commands and enimasq-dbg, which read the
// kernel, not the table.
type KernelPolicyEntry struct {
	Map   string
	Pod   netip.Addr
	Peer  netip.Prefix
	Value bpf.PolicyValue
}

func (e KernelPolicyEntry) String() string {
	return fmt.Sprintf("%s %s %s %s", e.Map, e.Pod, e.Peer, e.Value.String())
}

// ListPolicyMap returns the entries of the policy map name, sorted by pod
// then peer. With a valid pod, only that pod's entries.
func ListPolicyMap(name string, m bpf.LookupMap, pod netip.Addr) ([]KernelPolicyEntry, error) {
	_, fam, err := bpf.ParsePolicyMapName(name)
	if err != nil {
		return nil, err
	}
	keys, err := bpf.Keys(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var out []KernelPolicyEntry
	value := make([]byte, m.ValueSize())
	for _, key := range keys {
		p, peer, err := bpf.UnmarshalPolicyKey(fam, key)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if pod.IsValid() && p != pod {
			continue
		}
		if err := m.Lookup(key, value); errors.Is(err, ebpf.ErrKeyNotExist) {
			continue // deleted since the keys were listed
		} else if err != nil {
			return nil, fmt.Errorf("%s key %s %s: %w", name, p, peer, err)
		}
		v, err := bpf.UnmarshalPolicyValue(value)
		if err != nil {
			return nil, fmt.Errorf("%s key %s %s: %w", name, p, peer, err)
		}
		out = append(out, KernelPolicyEntry{Map: name, Pod: p, Peer: peer, Value: v})
	}
	slices.SortFunc(out, func(a, b KernelPolicyEntry) int {
		if c := a.Pod.Compare(b.Pod); c != 0 {
			return c
		}
		return prefixorder.Compare(a.Peer, b.Peer)
	})
	return out, nil
}

// ListPolicyMaps lists the given maps (by name; nil maps are skipped) in
// the order of bpf.PolicyMapNames, one "map pod peer ports" line per entry.
func ListPolicyMaps[M bpf.LookupMap](maps map[string]M, pod netip.Addr) (string, error) {
	var out strings.Builder
	for _, name := range bpf.PolicyMapNames {
		m, ok := maps[name]
		if !ok || bpf.IsNil(m) {
			continue
		}
		entries, err := ListPolicyMap(name, m, pod)
		if err != nil {
			return "", err
		}
		for _, e := range entries {
			out.WriteString(e.String())
			out.WriteByte('\n')
		}
	}
	return out.String(), nil
}
