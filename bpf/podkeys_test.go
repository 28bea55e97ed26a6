package bpf

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"testing"
)

func TestEncodePolicyKey(t *testing.T) {
	for _, tc := range []struct {
		pod, peer string
		hex       string // "" = error
	}{
		// prefix length 32+32+8 = 72 (0x48), pod 10.130.100.133, version 0, peer 10.0.0.0
		{"10.130.100.133", "10.0.0.0/8", "48000000" + "0a826485" + "00000000" + "0a000000"},
		{"10.130.100.133", "10.1.2.3/8", "48000000" + "0a826485" + "00000000" + "0a000000"}, // host bits cleared
		{"10.0.0.1", "0.0.0.0/0", "40000000" + "0a000001" + "00000000" + "00000000"},
		{"2001:db8::1", "fe80::/10", "aa000000" + "20010db8000000000000000000000001" + "00000000" + "fe800000000000000000000000000000"},
		// The failures of the AWS agent: a v6 item never becomes a v4 key.
		{"10.0.0.1", "100::/64", ""},
		{"10.0.0.1", "fe80::/10", ""},
		{"10.0.0.1", "::ffff:10.0.0.0/104", ""},
		{"2001:db8::1", "10.0.0.0/8", ""},
	} {
		key, err := EncodePolicyKey(netip.MustParseAddr(tc.pod), netip.MustParsePrefix(tc.peer))
		if tc.hex == "" {
			if !errors.Is(err, ErrWrongFamily) {
				t.Errorf("%s %s: key %x, err %v; want ErrWrongFamily", tc.pod, tc.peer, key, err)
			}
			continue
		}
		want, _ := hex.DecodeString(tc.hex)
		// The prefix length is host order; the test machine is little endian.
		if err != nil || !bytes.Equal(key, want) {
			t.Errorf("%s %s: key %x, err %v; want %x", tc.pod, tc.peer, key, err, want)
			continue
		}
		fam := FamilyOf(netip.MustParseAddr(tc.pod))
		pod, peer, err := UnmarshalPolicyKey(fam, key)
		if err != nil || pod != netip.MustParseAddr(tc.pod) || peer != netip.MustParsePrefix(tc.peer).Masked() {
			t.Errorf("%s %s: decoded %s %s %v", tc.pod, tc.peer, pod, peer, err)
		}
	}
}

// TestPolicyKeyVersion: the version sits between the pod and the peer,
// covered by the prefix length, and is cleared by PolicyKeyVersionless.
func TestPolicyKeyVersion(t *testing.T) {
	pod, peer := netip.MustParseAddr("10.0.0.1"), netip.MustParsePrefix("10.2.0.0/16")
	key, err := AppendPolicyKeyVersion(nil, pod, 7, peer)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := hex.DecodeString("50000000" + "0a000001" + "07000000" + "0a020000")
	if !bytes.Equal(key, want) {
		t.Fatalf("key %x, want %x", key, want)
	}
	p, v, q, err := UnmarshalPolicyKeyVersion(IPv4, key)
	if err != nil || p != pod || v != 7 || q != peer {
		t.Errorf("decoded %s %d %s %v", p, v, q, err)
	}
	zero, _ := EncodePolicyKey(pod, peer)
	if !bytes.Equal(PolicyKeyVersionless(key), zero) || bytes.Equal(key, zero) {
		t.Errorf("versionless %x, want %x", PolicyKeyVersionless(key), zero)
	}
}

func TestUnmarshalPolicyKeyRefusesBadKeys(t *testing.T) {
	good, _ := EncodePolicyKey(netip.MustParseAddr("10.0.0.1"), netip.MustParsePrefix("10.0.0.0/8"))
	short := append([]byte(nil), good[:15]...)
	tooLong := append([]byte(nil), good...)
	tooLong[0] = 97
	podOnly := append([]byte(nil), good...)
	podOnly[0] = 63 // the pod and part of the version
	for name, key := range map[string][]byte{"short": short, "prefix 97": tooLong, "prefix 63": podOnly} {
		if _, _, err := UnmarshalPolicyKey(IPv4, key); err == nil {
			t.Errorf("%s: accepted %x", name, key)
		}
	}
}
