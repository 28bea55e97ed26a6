package bpf

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
)

// Family is an IP address family of an LPM key.
type Family uint8

const (
	// IPv4 keys carry 4 address bytes.
	IPv4 Family = 4
	// IPv6 keys carry 16 address bytes.
	IPv6 Family = 6
)

func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	default:
		return fmt.Sprintf("Family(%d)", uint8(f))
	}
}

// Key sizes in bytes, as the kernel sees them: the u32 prefix length followed
// by the address.
const (
	PrefixLenSize = 4
	KeySizeV4     = PrefixLenSize + 4
	KeySizeV6     = PrefixLenSize + 16
)

// ErrWrongFamily is wrapped by the key constructors when a prefix of one
// family is offered for a key of the other.
var ErrWrongFamily = errors.New("wrong address family")

// KeyV4 is the LPM-trie key of an IPv4 prefix: prefix length in host byte
// order, address in network byte order (Cilium's cilium_ipmasq_v4 layout).
type KeyV4 struct {
	PrefixLen uint32
	Addr      [4]byte
}

// KeyV6 is the LPM-trie key of an IPv6 prefix: prefix length in host byte
// order, address in network byte order (Cilium's cilium_ipmasq_v6 layout).
type KeyV6 struct {
	PrefixLen uint32
	Addr      [16]byte
}

// NewKeyV4 builds the key of an IPv4 prefix, with host bits cleared.
//
// It refuses an invalid prefix and any IPv6 prefix. An IPv4-mapped IPv6
// prefix (::ffff:a.b.c.d/n) is IPv6 as written and is refused too: the caller
// must unmap it deliberately, this function never does it silently.
func NewKeyV4(p netip.Prefix) (KeyV4, error) {
	if !p.IsValid() {
		return KeyV4{}, fmt.Errorf("IPv4 key from %s: invalid prefix", p)
	}
	addr := p.Addr()
	if addr.Is4In6() {
		return KeyV4{}, fmt.Errorf("IPv4 key from %s: IPv4-mapped IPv6 prefix is IPv6 as written; unmap it explicitly to use it as IPv4: %w", p, ErrWrongFamily)
	}
	if !addr.Is4() {
		return KeyV4{}, fmt.Errorf("IPv4 key from %s: IPv6 prefix: %w", p, ErrWrongFamily)
	}
	return KeyV4{PrefixLen: uint32(p.Bits()), Addr: p.Masked().Addr().As4()}, nil
}

// NewKeyV6 builds the key of an IPv6 prefix, with host bits cleared.
//
// It refuses an invalid prefix and any IPv4 prefix. An IPv4-mapped prefix
// written as IPv6 (::ffff:a.b.c.d/n) is IPv6 and accepted as it is.
func NewKeyV6(p netip.Prefix) (KeyV6, error) {
	if !p.IsValid() {
		return KeyV6{}, fmt.Errorf("IPv6 key from %s: invalid prefix", p)
	}
	if !p.Addr().Is6() {
		return KeyV6{}, fmt.Errorf("IPv6 key from %s: IPv4 prefix: %w", p, ErrWrongFamily)
	}
	return KeyV6{PrefixLen: uint32(p.Bits()), Addr: p.Masked().Addr().As16()}, nil
}

// EncodePrefix returns the kernel bytes of the key of p, choosing the key
// family from p itself: 8 bytes for an IPv4 prefix, 20 bytes for an IPv6 one
// (IPv4-mapped IPv6 included). Host bits are cleared.
func EncodePrefix(p netip.Prefix) ([]byte, error) {
	if !p.IsValid() {
		return nil, fmt.Errorf("key from %s: invalid prefix", p)
	}
	if p.Addr().Is4() {
		k, err := NewKeyV4(p)
		if err != nil {
			return nil, err
		}
		return k.AppendBinary(make([]byte, 0, KeySizeV4))
	}
	k, err := NewKeyV6(p)
	if err != nil {
		return nil, err
	}
	return k.AppendBinary(make([]byte, 0, KeySizeV6))
}

// AppendBinary appends the kernel bytes of k to b.
func (k KeyV4) AppendBinary(b []byte) ([]byte, error) {
	b = binary.NativeEndian.AppendUint32(b, k.PrefixLen)
	return append(b, k.Addr[:]...), nil
}

// MarshalBinary returns exactly the bytes the kernel expects for k.
func (k KeyV4) MarshalBinary() ([]byte, error) {
	return k.AppendBinary(make([]byte, 0, KeySizeV4))
}

// Prefix returns the prefix that k matches.
func (k KeyV4) Prefix() netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4(k.Addr), int(k.PrefixLen))
}

func (k KeyV4) String() string { return k.Prefix().String() }

// AppendBinary appends the kernel bytes of k to b.
func (k KeyV6) AppendBinary(b []byte) ([]byte, error) {
	b = binary.NativeEndian.AppendUint32(b, k.PrefixLen)
	return append(b, k.Addr[:]...), nil
}

// MarshalBinary returns exactly the bytes the kernel expects for k.
func (k KeyV6) MarshalBinary() ([]byte, error) {
	return k.AppendBinary(make([]byte, 0, KeySizeV6))
}

// Prefix returns the prefix that k matches.
func (k KeyV6) Prefix() netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom16(k.Addr), int(k.PrefixLen))
}

func (k KeyV6) String() string { return k.Prefix().String() }

// UnmarshalKey decodes the kernel bytes of an LPM key of the given family.
//
// The length must be exactly the family's key size and the prefix length at
// most the family's address bits. Address bits past the prefix length take no
// part in LPM matching; they are cleared in the result.
func UnmarshalKey(f Family, b []byte) (netip.Prefix, error) {
	var addr netip.Addr
	switch f {
	case IPv4:
		if len(b) != KeySizeV4 {
			return netip.Prefix{}, fmt.Errorf("IPv4 key %x: %d bytes, want %d", b, len(b), KeySizeV4)
		}
		addr = netip.AddrFrom4([4]byte(b[PrefixLenSize:]))
	case IPv6:
		if len(b) != KeySizeV6 {
			return netip.Prefix{}, fmt.Errorf("IPv6 key %x: %d bytes, want %d", b, len(b), KeySizeV6)
		}
		addr = netip.AddrFrom16([16]byte(b[PrefixLenSize:]))
	default:
		return netip.Prefix{}, fmt.Errorf("key %x: unknown family %s", b, f)
	}
	bits := binary.NativeEndian.Uint32(b)
	if bits > uint32(addr.BitLen()) {
		return netip.Prefix{}, fmt.Errorf("%s key %x: prefix length %d above %d", f, b, bits, addr.BitLen())
	}
	return netip.PrefixFrom(addr, int(bits)).Masked(), nil
}

// describeKey renders kernel key bytes for error messages: the prefix when
// the key has the size of an address key, hex otherwise.
func describeKey(key []byte) string {
	switch len(key) {
	case KeySizeV4, KeySizeV6:
		f := IPv4
		if len(key) == KeySizeV6 {
			f = IPv6
		}
		if p, err := UnmarshalKey(f, key); err == nil {
			return p.String()
		}
	case PolicyKeySizeV4, PolicyKeySizeV6:
		f := IPv4
		if len(key) == PolicyKeySizeV6 {
			f = IPv6
		}
		if pod, peer, err := UnmarshalPolicyKey(f, key); err == nil {
			return fmt.Sprintf("pod %s peer %s", pod, peer)
		}
	}
	return hex.EncodeToString(key)
}

// CanonicalizeLPMKey clears the data bits of an LPM key past its prefix
// length, in place. The kernel ignores those bits when matching, so two keys
// that differ only there name the same trie node. Works for any LPM key
// layout (u32 prefix length, then data). A prefix length past the data is
// left as it is.
func CanonicalizeLPMKey(key []byte) {
	if len(key) < PrefixLenSize {
		return
	}
	data := key[PrefixLenSize:]
	bits := binary.NativeEndian.Uint32(key)
	if bits >= uint32(len(data))*8 {
		return
	}
	full := int(bits / 8)
	if rem := bits % 8; rem != 0 {
		data[full] &= byte(0xff << (8 - rem))
		full++
	}
	clear(data[full:])
}

// FamilyOf is the family of an address as written: IPv4-mapped IPv6
// addresses are IPv6.
func FamilyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}
