package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// kernelKey builds the expected kernel bytes: prefix length in host order,
// then the address bytes.
func kernelKey(bits uint32, addr ...byte) []byte {
	return append(binary.NativeEndian.AppendUint32(nil, bits), addr...)
}

func TestNewKeyV4(t *testing.T) {
	tests := []struct {
		prefix  string
		want    []byte
		str     string
		wantErr string
	}{
		{prefix: "10.0.0.0/8", want: kernelKey(8, 10, 0, 0, 0), str: "10.0.0.0/8"},
		{prefix: "10.1.2.3/8", want: kernelKey(8, 10, 0, 0, 0), str: "10.0.0.0/8"},
		{prefix: "0.0.0.0/0", want: kernelKey(0, 0, 0, 0, 0), str: "0.0.0.0/0"},
		{prefix: "192.168.1.7/32", want: kernelKey(32, 192, 168, 1, 7), str: "192.168.1.7/32"},
		{prefix: "172.31.255.255/12", want: kernelKey(12, 172, 16, 0, 0), str: "172.16.0.0/12"},
		// The AWS agent's bugs: v6 excepts in a v4 map.
		{prefix: "100::/64", wantErr: "IPv6 prefix"},
		{prefix: "fe80::/10", wantErr: "IPv6 prefix"},
		{prefix: "::/0", wantErr: "IPv6 prefix"},
		{prefix: "::ffff:10.0.0.0/104", wantErr: "IPv4-mapped IPv6 prefix is IPv6 as written; unmap it explicitly"},
	}
	for _, tt := range tests {
		t.Run(tt.prefix, func(t *testing.T) {
			k, err := NewKeyV4(netip.MustParsePrefix(tt.prefix))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewKeyV4(%s) = %v, %v; want error containing %q", tt.prefix, k, err, tt.wantErr)
				}
				if !errors.Is(err, ErrWrongFamily) {
					t.Errorf("error %v does not wrap ErrWrongFamily", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewKeyV4(%s): %v", tt.prefix, err)
			}
			got, err := k.MarshalBinary()
			if err != nil || !bytes.Equal(got, tt.want) {
				t.Errorf("MarshalBinary() = %x, %v; want %x", got, err, tt.want)
			}
			if k.String() != tt.str {
				t.Errorf("String() = %q, want %q", k.String(), tt.str)
			}
			p, err := UnmarshalKey(IPv4, got)
			if err != nil || p.String() != tt.str {
				t.Errorf("UnmarshalKey = %s, %v; want %s", p, err, tt.str)
			}
		})
	}
}

func TestNewKeyV6(t *testing.T) {
	tests := []struct {
		prefix  string
		want    []byte
		str     string
		wantErr string
	}{
		{prefix: "fe80::/10", want: kernelKey(10, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), str: "fe80::/10"},
		{prefix: "100::1/64", want: kernelKey(64, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), str: "100::/64"},
		{prefix: "::/0", want: kernelKey(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), str: "::/0"},
		{prefix: "2001:db8::1/128", want: kernelKey(128, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1), str: "2001:db8::1/128"},
		// A 4in6 prefix written as v6 is v6.
		{prefix: "::ffff:10.0.0.0/104", want: kernelKey(104, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 0), str: "::ffff:10.0.0.0/104"},
		{prefix: "10.0.0.0/8", wantErr: "IPv4 prefix"},
		{prefix: "254.128.0.0/10", wantErr: "IPv4 prefix"},
	}
	for _, tt := range tests {
		t.Run(tt.prefix, func(t *testing.T) {
			k, err := NewKeyV6(netip.MustParsePrefix(tt.prefix))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrWrongFamily) {
					t.Fatalf("NewKeyV6(%s) = %v, %v; want ErrWrongFamily containing %q", tt.prefix, k, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewKeyV6(%s): %v", tt.prefix, err)
			}
			got, err := k.MarshalBinary()
			if err != nil || !bytes.Equal(got, tt.want) {
				t.Errorf("MarshalBinary() = %x, %v; want %x", got, err, tt.want)
			}
			if k.String() != tt.str {
				t.Errorf("String() = %q, want %q", k.String(), tt.str)
			}
			p, err := UnmarshalKey(IPv6, got)
			if err != nil || p.String() != tt.str {
				t.Errorf("UnmarshalKey = %s, %v; want %s", p, err, tt.str)
			}
		})
	}
}

func TestInvalidPrefix(t *testing.T) {
	var zero netip.Prefix
	bad := netip.PrefixFrom(netip.MustParseAddr("10.0.0.1"), 33)
	for _, p := range []netip.Prefix{zero, bad} {
		if _, err := NewKeyV4(p); err == nil {
			t.Errorf("NewKeyV4(%#v) succeeded", p)
		}
		if _, err := NewKeyV6(p); err == nil {
			t.Errorf("NewKeyV6(%#v) succeeded", p)
		}
		if _, err := EncodePrefix(p); err == nil {
			t.Errorf("EncodePrefix(%#v) succeeded", p)
		}
	}
}

func TestEncodePrefixPicksFamily(t *testing.T) {
	tests := []struct {
		prefix string
		size   int
	}{
		{"10.0.0.0/8", KeySizeV4},
		{"100::/64", KeySizeV6},
		{"fe80::/10", KeySizeV6},
		{"::ffff:10.0.0.0/104", KeySizeV6},
	}
	for _, tt := range tests {
		b, err := EncodePrefix(netip.MustParsePrefix(tt.prefix))
		if err != nil || len(b) != tt.size {
			t.Errorf("EncodePrefix(%s) = %x, %v; want %d bytes", tt.prefix, b, err, tt.size)
		}
	}
	// The exact malformed key of the AWS agent never comes out.
	b, _ := EncodePrefix(netip.MustParsePrefix("100::/64"))
	if bytes.Equal(b, kernelKey(64, 1, 0, 0, 0)) {
		t.Errorf("100::/64 encoded as a v4 key %x", b)
	}
}

func TestUnmarshalKeyErrors(t *testing.T) {
	tests := []struct {
		name string
		f    Family
		b    []byte
	}{
		{"v4 short", IPv4, kernelKey(8, 10, 0, 0)},
		{"v4 long", IPv4, kernelKey(8, 10, 0, 0, 0, 0)},
		{"v4 bits 64 (the AWS key)", IPv4, kernelKey(64, 1, 0, 0, 0)},
		{"v6 as v4 size", IPv6, kernelKey(64, 1, 0, 0, 0)},
		{"v6 bits 129", IPv6, kernelKey(129, make([]byte, 16)...)},
		{"unknown family", Family(5), kernelKey(8, 10, 0, 0, 0)},
		{"empty", IPv4, nil},
	}
	for _, tt := range tests {
		if p, err := UnmarshalKey(tt.f, tt.b); err == nil {
			t.Errorf("%s: UnmarshalKey(%s, %x) = %s, want error", tt.name, tt.f, tt.b, p)
		}
	}
}

func TestUnmarshalKeyClearsHostBits(t *testing.T) {
	p, err := UnmarshalKey(IPv4, kernelKey(8, 10, 1, 2, 3))
	if err != nil || p != netip.MustParsePrefix("10.0.0.0/8") {
		t.Errorf("got %s, %v", p, err)
	}
}

func TestCanonicalizeLPMKey(t *testing.T) {
	tests := []struct {
		in, want []byte
	}{
		{kernelKey(8, 10, 1, 2, 3), kernelKey(8, 10, 0, 0, 0)},
		{kernelKey(12, 172, 31, 255, 255), kernelKey(12, 172, 16, 0, 0)},
		{kernelKey(0, 1, 2, 3, 4), kernelKey(0, 0, 0, 0, 0)},
		{kernelKey(32, 1, 2, 3, 4), kernelKey(32, 1, 2, 3, 4)},
		{kernelKey(99, 1, 2, 3, 4), kernelKey(99, 1, 2, 3, 4)},
		// A policy-map style key: pod /32 + peer /8 = 40 bits.
		{kernelKey(40, 10, 0, 0, 1, 192, 168, 1, 1), kernelKey(40, 10, 0, 0, 1, 192, 0, 0, 0)},
		{[]byte{1, 2}, []byte{1, 2}},
	}
	for _, tt := range tests {
		got := bytes.Clone(tt.in)
		CanonicalizeLPMKey(got)
		if !bytes.Equal(got, tt.want) {
			t.Errorf("CanonicalizeLPMKey(%x) = %x, want %x", tt.in, got, tt.want)
		}
	}
}

func TestDescribeKey(t *testing.T) {
	tests := []struct {
		key  []byte
		want string
	}{
		{kernelKey(8, 10, 0, 0, 0), "10.0.0.0/8"},
		{kernelKey(10, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), "fe80::/10"},
		{kernelKey(64, 1, 0, 0, 0), "4000000001000000"},
		{[]byte{1, 2, 3}, "010203"},
	}
	for _, tt := range tests {
		if got := describeKey(tt.key); got != tt.want {
			t.Errorf("describeKey(%x) = %q, want %q", tt.key, got, tt.want)
		}
	}
}

// FuzzKeyRoundTrip checks that encoding then decoding gives the masked
// prefix back, that nothing panics, and that a v6 prefix never yields a key
// with 4 data bytes.
func FuzzKeyRoundTrip(f *testing.F) {
	f.Add([]byte{10, 0, 0, 0}, 8)
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 64)
	f.Add([]byte{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 10)
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 0}, 104)
	f.Add([]byte{64, 0, 0, 0, 1, 0, 0, 0}, 64)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, raw []byte, bits int) {
		// Any bytes through the decoder: no panic, and a decoded key
		// re-encodes to the canonical form of the same bytes.
		for _, fam := range []Family{IPv4, IPv6} {
			if p, err := UnmarshalKey(fam, raw); err == nil {
				b, err := EncodePrefix(p)
				want := bytes.Clone(raw)
				CanonicalizeLPMKey(want)
				if err != nil || !bytes.Equal(b, want) {
					t.Fatalf("UnmarshalKey(%s, %x) = %s re-encodes to %x, %v; want %x", fam, raw, p, b, err, want)
				}
			}
		}

		addr, ok := netip.AddrFromSlice(raw)
		if !ok {
			return
		}
		p := netip.PrefixFrom(addr, bits)
		b, err := EncodePrefix(p)
		if !p.IsValid() {
			if err == nil {
				t.Fatalf("EncodePrefix(invalid %s) = %x", p, b)
			}
			return
		}
		if err != nil {
			t.Fatalf("EncodePrefix(%s): %v", p, err)
		}
		_, err4 := NewKeyV4(p)
		_, err6 := NewKeyV6(p)
		if (err4 == nil) != addr.Is4() || (err6 == nil) != addr.Is6() {
			t.Fatalf("%s: NewKeyV4 err %v, NewKeyV6 err %v", p, err4, err6)
		}
		fam, size := IPv4, KeySizeV4
		if addr.Is6() {
			fam, size = IPv6, KeySizeV6
		}
		if len(b) != size {
			t.Fatalf("EncodePrefix(%s) = %d bytes, want %d", p, len(b), size)
		}
		if got := binary.NativeEndian.Uint32(b); got != uint32(bits) {
			t.Fatalf("EncodePrefix(%s) prefix length %d, want %d", p, got, bits)
		}
		back, err := UnmarshalKey(fam, b)
		if err != nil || back != p.Masked() {
			t.Fatalf("round trip of %s: %s, %v", p, back, err)
		}
	})
}
