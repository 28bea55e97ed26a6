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
		// prefix length 32+8 = 40 (0x28), pod 10.130.100.133, peer 10.0.0.0
		{"10.130.100.133", "10.0.0.0/8", "28000000" + "0a826485" + "0a000000"},
		{"10.130.100.133", "10.1.2.3/8", "28000000" + "0a826485" + "0a000000"}, // host bits cleared
		{"10.0.0.1", "0.0.0.0/0", "20000000" + "0a000001" + "00000000"},
		{"2001:db8::1", "fe80::/10", "8a000000" + "20010db8000000000000000000000001" + "fe800000000000000000000000000000"},
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

func TestUnmarshalPolicyKeyRefusesBadKeys(t *testing.T) {
	good, _ := EncodePolicyKey(netip.MustParseAddr("10.0.0.1"), netip.MustParsePrefix("10.0.0.0/8"))
	short := append([]byte(nil), good[:11]...)
	tooLong := append([]byte(nil), good...)
	tooLong[0] = 65
	podOnly := append([]byte(nil), good...)
	podOnly[0] = 31
	for name, key := range map[string][]byte{"short": short, "prefix 65": tooLong, "prefix 31": podOnly} {
		if _, _, err := UnmarshalPolicyKey(IPv4, key); err == nil {
			t.Errorf("%s: accepted %x", name, key)
		}
	}
}

func TestPolicyValue(t *testing.T) {
	v, err := NewPolicyValue([]PortEntry{
		{Protocol: ProtocolTCP, StartPort: 80},
		{Protocol: ProtocolTCP, StartPort: 8000, EndPort: 8080},
		{Protocol: ProtocolUDP},
	})
	if err != nil {
		t.Fatal(err)
	}
	if s := v.String(); s != "tcp/80,tcp/8000-8080,udp/*" {
		t.Errorf("String %q", s)
	}
	b, _ := v.MarshalBinary()
	if len(b) != PolicyValueSize {
		t.Fatalf("%d bytes", len(b))
	}
	back, err := UnmarshalPolicyValue(b)
	if err != nil || back != v {
		t.Errorf("round trip %v %v", back, err)
	}
	for _, tc := range []struct {
		proto     uint32
		port      uint16
		portKnown bool
		want      int
	}{
		{ProtocolTCP, 80, true, 0},
		{ProtocolTCP, 81, true, -1},
		{ProtocolTCP, 8000, true, 1},
		{ProtocolTCP, 8080, true, 1},
		{ProtocolTCP, 8081, true, -1},
		{ProtocolTCP, 80, false, -1}, // fragment: only any-port entries
		{ProtocolUDP, 9, false, 2},
		{ProtocolSCTP, 80, true, -1},
		{1, 0, false, -1},
	} {
		if got := v.Match(tc.proto, tc.port, tc.portKnown); got != tc.want {
			t.Errorf("Match(%d, %d, %t) = %d, want %d", tc.proto, tc.port, tc.portKnown, got, tc.want)
		}
	}
	var deny PolicyValue
	if deny.String() != "deny" || deny.Match(ProtocolTCP, 80, true) != -1 {
		t.Errorf("zero value: %s", deny.String())
	}
	anyV, _ := NewPolicyValue([]PortEntry{AnyPortEntry})
	if anyV.String() != "any" || anyV.Match(1, 0, false) != 0 {
		t.Errorf("any value: %s", anyV.String())
	}
	if _, err := NewPolicyValue(make([]PortEntry, PolicyMaxPortEntries+1)); err == nil {
		t.Error("25 entries accepted")
	}
}

func TestPolicyMapNames(t *testing.T) {
	for _, name := range PolicyMapNames {
		d, f, err := ParsePolicyMapName(name)
		if err != nil || PolicyMapName(d, f) != name {
			t.Errorf("%s: %s %s %v", name, d, f, err)
		}
	}
	if PolicyMapName(Ingress, IPv6) != PolicyIngressV6MapName {
		t.Error(PolicyMapName(Ingress, IPv6))
	}
}

func TestEncodePortEntriesMatchesPolicyValue(t *testing.T) {
	for _, entries := range [][]PortEntry{
		nil,
		{AnyPortEntry},
		{{Protocol: ProtocolTCP, StartPort: 80}, {Protocol: ProtocolUDP, StartPort: 1, EndPort: 9}, {Protocol: ProtocolSCTP}},
	} {
		v, _ := NewPolicyValue(entries)
		want, _ := v.MarshalBinary()
		got, text, err := EncodePortEntries(entries)
		if err != nil || !bytes.Equal(got, want) || text != v.String() {
			t.Errorf("%v: %x %q %v, want %x %q", entries, got, text, err, want, v.String())
		}
	}
	if _, _, err := EncodePortEntries(make([]PortEntry, 25)); err == nil {
		t.Error("25 entries accepted")
	}
}
