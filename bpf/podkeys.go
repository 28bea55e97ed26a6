package bpf

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
)

// The keys of the policy maps (package policybpf): {u32 prefixlen; pod;
// u32 version; peer}, an LPM key whose prefix covers the pod and the
// version and then the peer's prefix. They are bpf's, beside the prefix
// keys (keys.go): a key can only be built from a pod and a peer of the
// same family, whatever map it is for, and the operations describe every
// key they fail on ("key pod 10.0.0.5 peer 172.16.0.0/12", describeKey).
const (
	// PolicyKeySizeV4 and PolicyKeySizeV6 are {u32 prefixlen; pod; u32
	// version; peer}.
	PolicyKeySizeV4 = PrefixLenSize + 4 + PolicyVersionSize + 4
	PolicyKeySizeV6 = PrefixLenSize + 16 + PolicyVersionSize + 16
	// PolicyVersionSize is the size of a key's version (host order).
	PolicyVersionSize = 4
)

// EncodePolicyKey returns the kernel bytes of the policy-map key of a pod and
// a peer prefix at version 0 (a pod without an entry in
// enimasq_policy_versions; the agent writes versions from 1): see
// AppendPolicyKeyVersion.
func EncodePolicyKey(pod netip.Addr, peer netip.Prefix) ([]byte, error) {
	return AppendPolicyKeyVersion(nil, pod, 0, peer)
}

// AppendPolicyKey appends the kernel bytes of the key of pod and peer at
// version 0 to b (see AppendPolicyKeyVersion).
func AppendPolicyKey(b []byte, pod netip.Addr, peer netip.Prefix) ([]byte, error) {
	return AppendPolicyKeyVersion(b, pod, 0, peer)
}

// AppendPolicyKeyVersion appends the kernel bytes of the policy-map key of
// a pod, a version of its policy and a peer prefix to b: {u32 prefixlen =
// pod bits + 32 + peer bits (host order); pod address (network order); u32
// version (host order); peer address, host bits cleared (network order)}.
// On error b is returned unchanged.
//
// Pod and peer must be of the same family as written: an IPv6 peer never
// becomes an IPv4 key, and an IPv4-mapped IPv6 address is IPv6.
func AppendPolicyKeyVersion(b []byte, pod netip.Addr, version uint32, peer netip.Prefix) ([]byte, error) {
	switch {
	case !pod.IsValid():
		return b, fmt.Errorf("policy key for peer %s: invalid pod address", peer)
	case !peer.IsValid():
		return b, fmt.Errorf("policy key for pod %s: invalid peer prefix", pod)
	case pod.Zone() != "":
		return b, fmt.Errorf("policy key for pod %s: address has a zone", pod)
	case FamilyOf(pod) != FamilyOf(peer.Addr()):
		return b, fmt.Errorf("policy key for pod %s, peer %s: %s pod with an %s peer: %w",
			pod, peer, FamilyOf(pod), FamilyOf(peer.Addr()), ErrWrongFamily)
	}
	b = binary.NativeEndian.AppendUint32(b, uint32(pod.BitLen()+8*PolicyVersionSize+peer.Bits()))
	if pod.Is4() {
		p4, q4 := pod.As4(), peer.Masked().Addr().As4()
		b = append(b, p4[:]...)
		b = binary.NativeEndian.AppendUint32(b, version)
		return append(b, q4[:]...), nil
	}
	p16, q16 := pod.As16(), peer.Masked().Addr().As16()
	b = append(b, p16[:]...)
	b = binary.NativeEndian.AppendUint32(b, version)
	return append(b, q16[:]...), nil
}

// UnmarshalPolicyKey decodes the kernel bytes of a policy-map key of the
// given family, its version aside.
func UnmarshalPolicyKey(f Family, b []byte) (pod netip.Addr, peer netip.Prefix, err error) {
	pod, _, peer, err = UnmarshalPolicyKeyVersion(f, b)
	return pod, peer, err
}

// UnmarshalPolicyKeyVersion decodes the kernel bytes of a policy-map key
// of the given family. The prefix length must cover the whole pod address
// and version and at most the peer's.
func UnmarshalPolicyKeyVersion(f Family, b []byte) (pod netip.Addr, version uint32, peer netip.Prefix, err error) {
	var addrLen int
	switch f {
	case IPv4:
		addrLen = 4
	case IPv6:
		addrLen = 16
	default:
		return netip.Addr{}, 0, netip.Prefix{}, fmt.Errorf("policy key %x: unknown family %s", b, f)
	}
	if want := PrefixLenSize + 2*addrLen + PolicyVersionSize; len(b) != want {
		return netip.Addr{}, 0, netip.Prefix{}, fmt.Errorf("%s policy key %x: %d bytes, want %d", f, b, len(b), want)
	}
	bits := int(binary.NativeEndian.Uint32(b))
	fixed := addrLen*8 + 8*PolicyVersionSize
	if bits < fixed || bits > fixed+addrLen*8 {
		return netip.Addr{}, 0, netip.Prefix{}, fmt.Errorf("%s policy key %x: prefix length %d outside %d..%d", f, b, bits, fixed, fixed+addrLen*8)
	}
	b = b[PrefixLenSize:]
	pod, _ = netip.AddrFromSlice(b[:addrLen])
	version = binary.NativeEndian.Uint32(b[addrLen:])
	peerAddr, _ := netip.AddrFromSlice(b[addrLen+PolicyVersionSize:])
	return pod, version, netip.PrefixFrom(peerAddr, bits-fixed).Masked(), nil
}

// PolicyKeyVersionless clears the version of a policy-map key of either
// family (for matching keys whatever their version); other keys are
// returned as they are.
func PolicyKeyVersionless(key []byte) []byte {
	var addrLen int
	switch len(key) {
	case PolicyKeySizeV4:
		addrLen = 4
	case PolicyKeySizeV6:
		addrLen = 16
	default:
		return key
	}
	out := slices.Clone(key)
	clear(out[PrefixLenSize+addrLen : PrefixLenSize+addrLen+PolicyVersionSize])
	return out
}
