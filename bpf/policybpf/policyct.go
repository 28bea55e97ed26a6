package policybpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

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
	// PolicyFragsMapName is an LRU hash of the datagrams whose first
	// fragment passed, whose later fragments follow its verdict.
	PolicyFragsMapName = "enimasq_policy_frags"
	// PolicyVerdictsMapName is a per-CPU array of the decisions' counts, by
	// direction, verdict and step (VerdictCounterIndex).
	PolicyVerdictsMapName = "enimasq_policy_verdicts"
	// PolicyEventsMapName is the ring buffer of denied packets (with
	// events on: PolicyModeEvents).
	PolicyEventsMapName = "enimasq_policy_events"
)

// PolicyDefaultConntrackMax is the default size of the connection-tracking
// map (--policy-conntrack-max): the AWS network policy agent's default
// conntrack-cache-table-size.
const PolicyDefaultConntrackMax = 512 * 1024

// PolicyConntrackEntryBytes is the kernel memory of one connection of the
// tracking map (memlock of the LRU hash over its entries, measured on
// Linux 6.18: 128 bytes, 64 MiB at the default size).
const PolicyConntrackEntryBytes = 128

// policyStateMapNames are the maps of the programs' state.
var policyStateMapNames = []string{PolicyCTMapName, PolicyModeMapName, PolicyPodsMapName, PolicyFragsMapName,
	PolicyVerdictsMapName, PolicyEventsMapName}

// PolicyMode is the enforcing mode of the policy programs
// (--network-policy-enforcing-mode).
type PolicyMode uint32

const (
	// PolicyModeStandard: a pod that no policy selects is allowed.
	PolicyModeStandard PolicyMode = 0
	// PolicyModeStrict: a pod that no policy selects is denied, so that a
	// new pod has no traffic until its policy is in the kernel.
	PolicyModeStrict PolicyMode = 1
	// PolicyModeEvents is a flag of the mode word: denied packets go to
	// the events ring buffer (--policy-event-logs).
	PolicyModeEvents PolicyMode = 2
	// PolicyModeAudit is a flag of the mode word: a packet the policy
	// denies passes, counted apart (AuditCounterIndex) and reported as
	// audited (--policy-audit-mode, as Cilium's). Drops before the policy
	// (spoofed, malformed, unknown fragments) stay drops.
	PolicyModeAudit PolicyMode = 4
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
	s := "standard"
	if m&PolicyModeStrict != 0 {
		s = "strict"
	}
	if m&PolicyModeEvents != 0 {
		s += "+events"
	}
	if m&PolicyModeAudit != 0 {
		s += "+audit"
	}
	return s
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

// PolicyStateSpec is the spec of one of the programs' state maps (a name
// of PolicyStateMapNames), as the program declares it.
func PolicyStateSpec(name string) (*ebpf.MapSpec, error) {
	spec, err := loadPolicy()
	if err != nil {
		return nil, fmt.Errorf("load policy program spec: %w", err)
	}
	ms, ok := spec.Maps[name]
	if !ok || !slices.Contains(policyStateMapNames, name) {
		return nil, fmt.Errorf("the policy program has no state map %s", name)
	}
	return ms.Copy(), nil
}

// PolicyStateMapNames are the programs' state maps: tracked connections,
// mode, the devices' pods, fragments, verdict counters, events.
func PolicyStateMapNames() []string { return slices.Clone(policyStateMapNames) }

// PolicyFragsSpec is the spec of the map of the fragmented datagrams.
func PolicyFragsSpec() (*ebpf.MapSpec, error) {
	spec, err := loadPolicy()
	if err != nil {
		return nil, fmt.Errorf("load policy program spec: %w", err)
	}
	return spec.Maps[PolicyFragsMapName].Copy(), nil
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

// PolicyCTKeySize is struct ct_key of c/policy.c: {u8 pod[16]; u8
// peer[16]; u16 pod_port; u16 peer_port; u8 protocol; u8 family; u8 echo;
// u8 pad; u32 ifindex}. echo is, for an ICMP echo, the pod's direction its
// requests take (1 egress, 2 ingress, as Direction), 0 for other protocols.
const PolicyCTKeySize = 44

// PolicyConnection is a tracked connection as its key names it.
type PolicyConnection struct {
	// Ifindex is the pod's host-side device the connection was seen on.
	Ifindex  uint32
	Pod      netip.Addr
	Peer     netip.Addr
	Protocol uint8
	// PodPort and PeerPort are the ports; for an ICMP echo both are its
	// identifier.
	PodPort  uint16
	PeerPort uint16
	// EchoRequests is, for an ICMP echo, the pod's direction its requests
	// take: Egress (the pod asks, the peer's replies pass) or Ingress (the
	// peer asks, the pod's replies pass); 0 for other protocols. The
	// programs pass as tracked only the replies going the other way.
	EchoRequests Direction
}

// ParsePolicyCTKey decodes a key of the connection-tracking map; false for
// a key of another size, family or echo direction (another version's
// layout).
func ParsePolicyCTKey(k []byte) (PolicyConnection, bool) {
	if len(k) != PolicyCTKeySize {
		return PolicyConnection{}, false
	}
	c := PolicyConnection{
		PodPort:  binary.NativeEndian.Uint16(k[32:]),
		PeerPort: binary.NativeEndian.Uint16(k[34:]),
		Protocol: k[36],
		Ifindex:  binary.NativeEndian.Uint32(k[40:]),
	}
	switch Direction(k[38]) {
	case 0:
	case Egress, Ingress:
		c.EchoRequests = Direction(k[38])
	default:
		return PolicyConnection{}, false
	}
	switch k[37] {
	case 4:
		c.Pod, c.Peer = netip.AddrFrom4([4]byte(k[0:4])), netip.AddrFrom4([4]byte(k[16:20]))
	case 6:
		c.Pod, c.Peer = netip.AddrFrom16([16]byte(k[0:16])), netip.AddrFrom16([16]byte(k[16:32]))
	default:
		return PolicyConnection{}, false
	}
	return c, true
}

// ForgetPolicyConnections deletes the tracked connections that forget
// names (a pod's device gone, a pod IP released: a new pod on the IP, or
// on a reused ifindex, must start with none of them) and returns how many
// went. Keys are collected first, then deleted: deleting while iterating a
// hash map can skip keys. Both go in batches (BPF_MAP_LOOKUP_BATCH,
// BPF_MAP_DELETE_BATCH; key by key where the kernel has none): a walk of
// 512k connections is a few hundred syscalls. Forgetting for many pods or
// devices at once is one walk with a forget that names them all.
func ForgetPolicyConnections(m *ebpf.Map, forget func(PolicyConnection) bool) (int, error) {
	var stale [][]byte
	err := policyCTKeys(m, func(key []byte) {
		if c, ok := ParsePolicyCTKey(key); !ok || forget(c) {
			stale = append(stale, key)
		}
	})
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", PolicyCTMapName, err)
	}
	return deletePolicyCTKeys(m, stale)
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
