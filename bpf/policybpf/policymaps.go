package policybpf

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/enimasq/enimasq/bpf"
	"golang.org/x/sys/unix"
)

// Direction is the direction of traffic a network-policy map governs, seen
// from the pod.
type Direction uint8

const (
	// Egress: the pod is the packet's source, the peer its destination.
	Egress Direction = iota + 1
	// Ingress: the pod is the packet's destination, the peer its source.
	Ingress
)

func (d Direction) String() string {
	switch d {
	case Egress:
		return "egress"
	case Ingress:
		return "ingress"
	default:
		return fmt.Sprintf("Direction(%d)", uint8(d))
	}
}

// ParseDirection parses "egress" or "ingress" (any case).
func ParseDirection(s string) (Direction, error) {
	switch strings.ToLower(s) {
	case "egress":
		return Egress, nil
	case "ingress":
		return Ingress, nil
	}
	return 0, fmt.Errorf("direction %q: want egress or ingress", s)
}

// Names, sizes and layout of the network-policy maps: one LPM trie per
// direction and family, pinned next to Cilium's maps.
const (
	PolicyEgressV4MapName  = "enimasq_egress_v4"
	PolicyEgressV6MapName  = "enimasq_egress_v6"
	PolicyIngressV4MapName = "enimasq_ingress_v4"
	PolicyIngressV6MapName = "enimasq_ingress_v6"

	// PolicyDefaultMaxEntries is the default size of each policy map.
	PolicyDefaultMaxEntries = 65536

	// The cluster maps, from ClusterPolicyEndpoints: the same keys and
	// values as the NetworkPolicy maps.
	ClusterEgressV4MapName  = "enimasq_cluster_egress_v4"
	ClusterEgressV6MapName  = "enimasq_cluster_egress_v6"
	ClusterIngressV4MapName = "enimasq_cluster_ingress_v4"
	ClusterIngressV6MapName = "enimasq_cluster_ingress_v6"
)

// IP protocol numbers of port entries.
const (
	ProtocolTCP  uint32 = 6
	ProtocolUDP  uint32 = 17
	ProtocolSCTP uint32 = 132
	// ProtocolAny matches every protocol (a rule without ports).
	ProtocolAny uint32 = 254
)

// PolicyMapName is the name of the map of a direction and family.
func PolicyMapName(d Direction, f bpf.Family) string {
	return "enimasq_" + d.String() + "_v" + strconv.Itoa(int(f))
}

// PolicyMapNames are the four policy maps, in a fixed order.
var PolicyMapNames = []string{PolicyEgressV4MapName, PolicyEgressV6MapName, PolicyIngressV4MapName, PolicyIngressV6MapName}

// ClusterMapName is the name of the cluster map of a direction and family.
func ClusterMapName(d Direction, f bpf.Family) string {
	return "enimasq_cluster_" + d.String() + "_v" + strconv.Itoa(int(f))
}

// ClusterMapNames are the four cluster maps, in a fixed order.
var ClusterMapNames = []string{ClusterEgressV4MapName, ClusterEgressV6MapName, ClusterIngressV4MapName, ClusterIngressV6MapName}

// ParseClusterMapName returns the direction and family of a cluster map
// name.
func ParseClusterMapName(name string) (Direction, bpf.Family, error) {
	for _, d := range []Direction{Egress, Ingress} {
		for _, f := range []bpf.Family{bpf.IPv4, bpf.IPv6} {
			if ClusterMapName(d, f) == name {
				return d, f, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("%q is not a cluster policy map name", name)
}

// ClusterMapSpec describes the cluster map of a direction and family.
func ClusterMapSpec(d Direction, f bpf.Family, maxEntries uint32) *ebpf.MapSpec {
	spec := PolicyMapSpec(d, f, maxEntries)
	spec.Name = ClusterMapName(d, f)
	return spec
}

// ChunkMapSpec describes a chunk map (PolicyChunksMapName or
// ClusterChunksMapName): a hash of {list id, index} -> 64 intervals.
func ChunkMapSpec(name string, maxEntries uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       name,
		Type:       ebpf.Hash,
		KeySize:    PolicyChunkKeySize,
		ValueSize:  PolicyChunkValueSize,
		MaxEntries: maxEntries,
		Flags:      unix.BPF_F_NO_PREALLOC,
	}
}

// ParsePolicyMapName returns the direction and family of a policy map name.
func ParsePolicyMapName(name string) (Direction, bpf.Family, error) {
	for _, d := range []Direction{Egress, Ingress} {
		for _, f := range []bpf.Family{bpf.IPv4, bpf.IPv6} {
			if PolicyMapName(d, f) == name {
				return d, f, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("%q is not a policy map name", name)
}

// PolicyMapSpec describes the policy map of a direction and family with the
// given number of entries.
func PolicyMapSpec(d Direction, f bpf.Family, maxEntries uint32) *ebpf.MapSpec {
	keySize := uint32(bpf.PolicyKeySizeV4)
	if f == bpf.IPv6 {
		keySize = bpf.PolicyKeySizeV6
	}
	return bpf.LPMSpec(PolicyMapName(d, f), keySize, PolicyValueSize, maxEntries)
}

// PortEntry is one allow entry of a policy value.
type PortEntry struct {
	// Protocol is the IP protocol number; ProtocolAny matches every one.
	// Zero marks an unused slot.
	Protocol uint32
	// StartPort is the first allowed port; 0 allows every port.
	StartPort uint32
	// EndPort is the last allowed port; 0 allows StartPort only.
	EndPort uint32
}

// AnyPortEntry allows everything: every protocol, every port.
var AnyPortEntry = PortEntry{Protocol: ProtocolAny}

// Allows reports whether the entry allows a packet of protocol proto to port
// (portKnown false: a packet whose port is unknown, which only entries for
// every port allow). It is the program's rule, in Go.
func (e PortEntry) Allows(proto uint32, port uint16, portKnown bool) bool {
	if e.Protocol != ProtocolAny && e.Protocol != proto {
		return false
	}
	switch {
	case e.StartPort == 0:
		return true
	case !portKnown:
		return false
	case e.EndPort == 0:
		return uint32(port) == e.StartPort
	default:
		return uint32(port) >= e.StartPort && uint32(port) <= e.EndPort
	}
}

func (e PortEntry) String() string {
	return string(e.appendText(nil))
}

func (e PortEntry) appendText(b []byte) []byte {
	if e.Protocol == ProtocolAny && e.StartPort == 0 {
		return append(b, "any"...)
	}
	b = append(append(b, ProtocolName(e.Protocol)...), '/')
	switch {
	case e.StartPort == 0:
		return append(b, '*')
	case e.EndPort == 0:
		return strconv.AppendUint(b, uint64(e.StartPort), 10)
	default:
		b = append(strconv.AppendUint(b, uint64(e.StartPort), 10), '-')
		return strconv.AppendUint(b, uint64(e.EndPort), 10)
	}
}

// ProtocolName is "tcp", "udp", "sctp", "icmp", "icmpv6", "any" or the
// number.
func ProtocolName(p uint32) string {
	switch p {
	case 1:
		return "icmp"
	case 58:
		return "icmpv6"
	case ProtocolTCP:
		return "tcp"
	case ProtocolUDP:
		return "udp"
	case ProtocolSCTP:
		return "sctp"
	case ProtocolAny:
		return "any"
	default:
		return strconv.FormatUint(uint64(p), 10)
	}
}

// ParseProtocol parses "tcp", "udp", "sctp", "icmp", "icmpv6" (any case) or
// a protocol number.
func ParseProtocol(s string) (uint32, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return ProtocolTCP, nil
	case "udp":
		return ProtocolUDP, nil
	case "sctp":
		return ProtocolSCTP, nil
	case "icmp":
		return 1, nil
	case "icmpv6", "ipv6-icmp":
		return 58, nil
	}
	n, err := strconv.ParseUint(s, 10, 8)
	if err != nil {
		return 0, fmt.Errorf("protocol %q: want tcp, udp, sctp, icmp, icmpv6 or a number", s)
	}
	return uint32(n), nil
}

// PortKnown reports whether packets of the protocol carry ports the
// program reads (TCP, UDP, SCTP).
func PortKnown(proto uint32) bool {
	return proto == ProtocolTCP || proto == ProtocolUDP || proto == ProtocolSCTP
}
