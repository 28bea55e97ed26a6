package awspeer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Protocol numbers as the agent writes them (utils.go).
const (
	ProtocolTCP  uint32 = 6
	ProtocolUDP  uint32 = 17
	ProtocolSCTP uint32 = 132
	// ProtocolAny is ANY_IP_PROTOCOL: a network policy port without a
	// protocol, or a cluster policy rule without ports.
	ProtocolAny uint32 = 254
	// ProtocolReserved is RESERVED_IP_PROTOCOL_NUMBER: deny all (the
	// network policy loop stops at it with a deny).
	ProtocolReserved uint32 = 255
)

// Action is a cluster policy rule's action (utils.CPActionType).
type Action uint32

const (
	ActionDeny Action = iota
	ActionAccept
	ActionPass
)

const (
	// MaxPortEntries is MAX_PORT_PROTOCOL: the entries of one value.
	MaxPortEntries = 24
	// AdminTierPriorityLimit is the highest priority of the admin tier
	// (ADMIN_TIER_PRIORITY_LIMIT).
	AdminTierPriorityLimit = 1000
	// BaselinePriorityOffset is added to a baseline tier policy's
	// priority (fwruleprocessor.BASELINE_TIER_PRIORITY_OFFSET).
	BaselinePriorityOffset = 2000
)

// PortRule is one port entry of a network policy value (struct
// lpm_trie_val): a protocol number and a port or range. StartPort 0 is any
// port; a range matches StartPort and (StartPort, EndPort].
type PortRule struct {
	Protocol, StartPort, EndPort uint32
}

// ClusterRule is one entry of a cluster policy value (struct
// lpm_cp_trie_val). Priority is L4Rule.Priority: the policy's priority, plus
// BaselinePriorityOffset for a baseline tier policy.
type ClusterRule struct {
	Protocol  uint32
	Priority  uint32
	Action    Action
	StartPort uint32
	EndPort   uint32
}

// TrieKey is the agent's utils.ComputeTrieKey for an IPv4 prefix: the prefix
// length (little-endian __u32) and the address's 4 bytes.
func TrieKey(p netip.Prefix) ([]byte, error) {
	if !p.IsValid() || !p.Addr().Is4() {
		return nil, fmt.Errorf("%s: not an IPv4 prefix", p)
	}
	key := make([]byte, 8)
	binary.LittleEndian.PutUint32(key, uint32(p.Bits()))
	a := p.Masked().Addr().As4()
	copy(key[4:], a[:])
	return key, nil
}

// NetworkPolicyValue is the agent's utils.ComputeTrieValue(ports, false,
// false) for rules already resolved to protocol numbers: 24 entries of
// {protocol, start_port, end_port} (__u32 each, little-endian), the rules
// first and zeros after. No rules is the agent's allow-all entry,
// {ProtocolAny, 0, 0}. More than 24 rules is an error (the agent logs one
// and keeps the first 24).
func NetworkPolicyValue(rules []PortRule) ([]byte, error) {
	if len(rules) > MaxPortEntries {
		return nil, fmt.Errorf("%d port entries: at most %d", len(rules), MaxPortEntries)
	}
	if len(rules) == 0 {
		rules = []PortRule{{Protocol: ProtocolAny}}
	}
	val := make([]byte, MaxPortEntries*12)
	for i, r := range rules {
		binary.LittleEndian.PutUint32(val[12*i:], r.Protocol)
		binary.LittleEndian.PutUint32(val[12*i+4:], r.StartPort)
		binary.LittleEndian.PutUint32(val[12*i+8:], r.EndPort)
	}
	return val, nil
}

// ClusterPolicyValue is the agent's utils.ComputeTrieValueForCPE: 24
// entries of {protocol, priority*10+action, start_port, end_port}, the rules
// first and zeros after. More than 24 rules is an error.
func ClusterPolicyValue(rules []ClusterRule) ([]byte, error) {
	if len(rules) > MaxPortEntries {
		return nil, fmt.Errorf("%d cluster policy entries: at most %d", len(rules), MaxPortEntries)
	}
	val := make([]byte, MaxPortEntries*16)
	for i, r := range rules {
		if r.Action > ActionPass {
			return nil, fmt.Errorf("action %d", r.Action)
		}
		binary.LittleEndian.PutUint32(val[16*i:], r.Protocol)
		binary.LittleEndian.PutUint32(val[16*i+4:], r.Priority*10+uint32(r.Action))
		binary.LittleEndian.PutUint32(val[16*i+8:], r.StartPort)
		binary.LittleEndian.PutUint32(val[16*i+12:], r.EndPort)
	}
	return val, nil
}

// Frame is an Ethernet + IPv4 + TCP SYN frame from src to dst: the layout of
// enimasq's policybpf.PolicyTestFrame (zero MACs, TTL 64, no checksums, a 20-byte
// TCP header), with the SYN flag set.
func Frame(src, dst netip.Addr, srcPort, dstPort uint16) ([]byte, error) {
	if !src.Is4() || !dst.Is4() {
		return nil, errors.New("frame: IPv4 addresses only")
	}
	frame := make([]byte, 14+20+20)
	binary.BigEndian.PutUint16(frame[12:], 0x0800)
	ip := frame[14:34]
	ip[0] = 0x45 // version 4, IHL 5
	binary.BigEndian.PutUint16(ip[2:], 20+20)
	ip[8], ip[9] = 64, byte(ProtocolTCP)
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	tcp := frame[34:]
	binary.BigEndian.PutUint16(tcp[0:], srcPort)
	binary.BigEndian.PutUint16(tcp[2:], dstPort)
	tcp[12] = 5 << 4 // data offset
	tcp[13] = 0x02   // SYN
	return frame, nil
}
