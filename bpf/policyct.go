package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

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
	// PolicyPodsMapName is a hash of the pods of the devices the programs
	// are on: pod address -> the device's ifindex.
	PolicyPodsMapName = "enimasq_policy_pods"
)

// policyStateMapNames are the maps of the programs' state.
var policyStateMapNames = []string{PolicyCTMapName, PolicyModeMapName, PolicyPodsMapName}

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

// PolicyPodsSpec is the spec of the map of the devices' pods.
func PolicyPodsSpec() (*ebpf.MapSpec, error) {
	spec, err := loadPolicy()
	if err != nil {
		return nil, fmt.Errorf("load policy program spec: %w", err)
	}
	return spec.Maps[PolicyPodsMapName].Copy(), nil
}

// PolicyPodKey is the key of a pod address in the devices' pods map.
func PolicyPodKey(addr netip.Addr) []byte {
	k := make([]byte, 20)
	k[0] = 6
	if addr.Is4() {
		k[0] = 4
		a := addr.As4()
		copy(k[4:], a[:])
	} else {
		a := addr.As16()
		copy(k[4:], a[:])
	}
	return k
}

// PolicyPodOfKey is the address of a key of the devices' pods map.
func PolicyPodOfKey(k []byte) (netip.Addr, bool) {
	if len(k) != 20 {
		return netip.Addr{}, false
	}
	switch k[0] {
	case 4:
		return netip.AddrFrom4([4]byte(k[4:8])), true
	case 6:
		return netip.AddrFrom16([16]byte(k[4:20])), true
	}
	return netip.Addr{}, false
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
