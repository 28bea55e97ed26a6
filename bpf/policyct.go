package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// The state of the policy programs (c/policy.c) besides the policy maps:
// the connections they track, and the enforcing mode.
const (
	// PolicyCTMapName is the connection-tracking map: an LRU hash of the
	// connections the policy allowed, seen from the pod.
	PolicyCTMapName = "enimasq_policy_ct"
	// PolicyModeMapName is a one-element array: the enforcing mode.
	PolicyModeMapName = "enimasq_policy_mode"
)

// PolicyMode is the enforcing mode of the policy programs
// (--network-policy-enforcing-mode).
type PolicyMode uint32

const (
	// PolicyModeStandard: a pod that no policy selects is allowed.
	PolicyModeStandard PolicyMode = 0
	// PolicyModeStrict: a pod that no policy selects is denied, so that a
	// new pod has no traffic until its policy is in the kernel.
	PolicyModeStrict PolicyMode = 1
)

// ParsePolicyMode parses "standard" or "strict".
func ParsePolicyMode(s string) (PolicyMode, error) {
	switch s {
	case "standard":
		return PolicyModeStandard, nil
	case "strict":
		return PolicyModeStrict, nil
	}
	return 0, fmt.Errorf("enforcing mode %q: want standard or strict", s)
}

func (m PolicyMode) String() string {
	if m == PolicyModeStrict {
		return "strict"
	}
	return "standard"
}

// PolicyStateSpecs are the specs of the programs' state maps (tracked
// connections, mode), as the program declares them, for pinning.
func PolicyStateSpecs() (ct, mode *ebpf.MapSpec, err error) {
	spec, err := loadPolicy()
	if err != nil {
		return nil, nil, fmt.Errorf("load policy program spec: %w", err)
	}
	return spec.Maps[PolicyCTMapName].Copy(), spec.Maps[PolicyModeMapName].Copy(), nil
}

// SetPolicyMode writes the mode into a mode map.
func SetPolicyMode(m *ebpf.Map, mode PolicyMode) error {
	if err := m.Put(uint32(0), uint32(mode)); err != nil {
		return fmt.Errorf("set the policy mode to %s: %w", mode, err)
	}
	return nil
}

// PolicyConnections is the number of connections in a connection-tracking
// map (live or idle past their timeout, which the programs drop when they
// next see them).
func PolicyConnections(m *ebpf.Map) (int, error) {
	var (
		n    int
		key  = make([]byte, m.KeySize())
		next = make([]byte, m.KeySize())
	)
	var cursor any // nil: the first key
	// A deleted or evicted cursor restarts the walk: it is bounded.
	for range m.MaxEntries() + 1 {
		if err := m.NextKey(cursor, next); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return n, nil
			}
			return n, err
		}
		n++
		copy(key, next)
		cursor = key
	}
	return n, fmt.Errorf("the map changed while its connections were counted")
}

// icmpEcho is an ICMP (ICMPv6) echo request header with identifier id.
func icmpEcho(v6 bool, id uint16) []byte {
	h := make([]byte, 8)
	h[0] = 8 // echo request
	if v6 {
		h[0] = 128
	}
	binary.BigEndian.PutUint16(h[4:], id)
	return h
}

// clearMap deletes every key of a hash map.
func clearMap(m *ebpf.Map) error {
	key := make([]byte, m.KeySize())
	for {
		if err := m.NextKey(nil, key); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return nil
			}
			return err
		}
		if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
}
