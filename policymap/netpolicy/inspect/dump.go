package inspect

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/prefixorder"
)

// KernelPolicyEntry is one entry of a policy map as the kernel holds it,
// decoded. Used by the script commands and enimasq-dbg, which read the
// kernel, not the table.
type KernelPolicyEntry struct {
	Map   string
	Pod   netip.Addr
	Peer  netip.Prefix
	Value policybpf.PolicyValue
	// Version is the version of the pod's policy the key belongs to, and
	// InForce whether it is the one the kernel has in force for the pod
	// (enimasq_policy_versions): only those decide.
	Version uint32
	InForce bool
}

// String is "map pod peer ports", with the version when it is not in
// force (one being written, or one being replaced).
func (e KernelPolicyEntry) String() string {
	s := fmt.Sprintf("%s %s %s %s", e.Map, e.Pod, e.Peer, e.Ports())
	if !e.InForce {
		s += fmt.Sprintf(" (version %d, not in force)", e.Version)
	}
	return s
}

// Ports is the value as text: a NetworkPolicy value's ports, a cluster
// value's intervals with the winners of both tiers.
func (e KernelPolicyEntry) Ports() string {
	if slices.Contains(policybpf.ClusterMapNames, e.Map) {
		return e.Value.TiersString()
	}
	return e.Value.String()
}

// ListPolicyMap returns the entries of the policy or cluster map name,
// sorted by pod then peer then version, their values read whole from chunks
// (the map's chunk map; nil when it is not open: a long value is then an
// error), each marked in force or not by versions (the versions map; nil:
// version 0 is). With a valid pod, only that pod's entries.
func ListPolicyMap(name string, m, chunks, versions bpf.LookupMap, pod netip.Addr) ([]KernelPolicyEntry, error) {
	tier := policybpf.TierNetworkPolicy
	_, fam, err := policybpf.ParsePolicyMapName(name)
	if err != nil {
		if _, fam, err = policybpf.ParseClusterMapName(name); err != nil {
			return nil, err
		}
		tier = policybpf.TierCluster
	}
	inForce := func(netip.Addr) uint32 { return policybpf.PolicyVersionNone }
	if versions != nil && !bpf.IsNil(versions) {
		inForce = func(p netip.Addr) uint32 {
			v := make([]byte, policybpf.PolicyVersionValueSize)
			if err := versions.Lookup(policybpf.PolicyPodKey(p), v); err != nil {
				return policybpf.PolicyVersionNone
			}
			np, cl, _ := policybpf.DecodePolicyVersions(v)
			return [2]uint32{np, cl}[tier]
		}
	}
	var lookup func([]byte) ([]byte, error)
	if chunks != nil && !bpf.IsNil(chunks) {
		lookup = func(key []byte) ([]byte, error) {
			v := make([]byte, chunks.ValueSize())
			if err := chunks.Lookup(key, v); err != nil {
				if errors.Is(err, ebpf.ErrKeyNotExist) {
					return nil, policybpf.ErrChunkMissing
				}
				return nil, err
			}
			return v, nil
		}
	}
	keys, err := bpf.Keys(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var out []KernelPolicyEntry
	value := make([]byte, m.ValueSize())
	for _, key := range keys {
		p, version, peer, err := bpf.UnmarshalPolicyKeyVersion(fam, key)
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
		v, err := policybpf.UnmarshalPolicyValue(value, lookup)
		if err != nil {
			return nil, fmt.Errorf("%s key %s %s: %w", name, p, peer, err)
		}
		out = append(out, KernelPolicyEntry{Map: name, Pod: p, Peer: peer, Value: v, Version: version, InForce: version == inForce(p)})
	}
	slices.SortFunc(out, func(a, b KernelPolicyEntry) int {
		if c := a.Pod.Compare(b.Pod); c != 0 {
			return c
		}
		if c := prefixorder.Compare(a.Peer, b.Peer); c != 0 {
			return c
		}
		return cmp.Compare(a.Version, b.Version)
	})
	return out, nil
}

// ChunksOf is the chunk map of a policy or cluster map.
func ChunksOf(name string) string {
	if slices.Contains(policybpf.ClusterMapNames, name) {
		return policybpf.ClusterChunksMapName
	}
	return policybpf.PolicyChunksMapName
}

// lookupIn returns the map of that name, nil if absent.
func lookupIn[M bpf.LookupMap](maps map[string]M, name string) bpf.LookupMap {
	m, ok := maps[name]
	if !ok || bpf.IsNil(m) {
		return nil
	}
	return m
}

// ListPolicyMaps lists the given maps (by name; nil maps are skipped) in
// the order of policybpf.PolicyMapNames then policybpf.ClusterMapNames, one "map pod
// peer ports" line per entry.
func ListPolicyMaps[M bpf.LookupMap](maps map[string]M, pod netip.Addr) (string, error) {
	var out strings.Builder
	for _, name := range slices.Concat(policybpf.PolicyMapNames, policybpf.ClusterMapNames) {
		m := lookupIn(maps, name)
		if m == nil {
			continue
		}
		entries, err := ListPolicyMap(name, m, lookupIn(maps, ChunksOf(name)), lookupIn(maps, policybpf.PolicyVersionsMapName), pod)
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
