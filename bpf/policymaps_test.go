package bpf

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"reflect"
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

func TestPolicyValue(t *testing.T) {
	v := AllowValue(
		PortEntry{Protocol: ProtocolTCP, StartPort: 80},
		PortEntry{Protocol: ProtocolTCP, StartPort: 8000, EndPort: 8080},
		PortEntry{Protocol: ProtocolTCP, StartPort: 81}, // touches 80: merged
		PortEntry{Protocol: ProtocolUDP},
	)
	if s := v.String(); s != "tcp/80-81,tcp/8000-8080,udp/*" {
		t.Errorf("String %q", s)
	}
	b, chunks, err := v.Encode()
	if err != nil || len(b) != PolicyValueSize || len(chunks) != 0 {
		t.Fatalf("%d bytes, %d chunks, %v", len(b), len(chunks), err)
	}
	back, err := UnmarshalPolicyValue(b, nil)
	if err != nil || !reflect.DeepEqual(back.Intervals, v.Intervals) || back.NotIsolated {
		t.Errorf("round trip %v %v", back, err)
	}
	for _, tc := range []struct {
		proto     uint32
		port      uint16
		portKnown bool
		want      int
	}{
		{ProtocolTCP, 80, true, 0},
		{ProtocolTCP, 81, true, 0},
		{ProtocolTCP, 82, true, -1},
		{ProtocolTCP, 8000, true, 1},
		{ProtocolTCP, 8080, true, 1},
		{ProtocolTCP, 8081, true, -1},
		{ProtocolTCP, 80, false, -1}, // no port: only every-port intervals
		{ProtocolUDP, 9, false, 2},
		{ProtocolSCTP, 80, true, -1},
		{1, 0, false, -1},
	} {
		if got := v.Search(PortPoint(tc.proto, tc.port, tc.portKnown)); got != tc.want {
			t.Errorf("Search(%d, %d, %t) = %d, want %d", tc.proto, tc.port, tc.portKnown, got, tc.want)
		}
	}
	deny := AllowValue()
	if deny.String() != "deny" || deny.Search(PortPoint(ProtocolTCP, 80, true)) != -1 {
		t.Errorf("no entries: %s", deny.String())
	}
	anyV := AllowValue(AnyPortEntry, PortEntry{Protocol: ProtocolTCP, StartPort: 80})
	if anyV.String() != "any" || anyV.Search(PortPoint(1, 0, false)) != 0 {
		t.Errorf("any value: %s", anyV.String())
	}
	if _, _, err := (&PolicyValue{Intervals: []Interval{{Lo: 5, Hi: 9}, {Lo: 9, Hi: 12}}}).Encode(); err == nil {
		t.Error("overlapping intervals accepted")
	}
}

// TestPolicyValueChunks: a value of any length encodes, the intervals past
// the inline ones in content-addressed chunks, and decodes back.
func TestPolicyValueChunks(t *testing.T) {
	for _, n := range []int{PolicyInlineIntervals, PolicyInlineIntervals + 1, 1000, 5000} {
		entries := make([]PortEntry, n)
		for i := range entries {
			entries[i] = PortEntry{Protocol: ProtocolTCP, StartPort: uint32(1 + 2*i)}
		}
		v := AllowValue(entries...)
		if len(v.Intervals) != n {
			t.Fatalf("%d entries: %d intervals", n, len(v.Intervals))
		}
		b, chunks, err := v.Encode()
		if err != nil {
			t.Fatal(err)
		}
		wantChunks := (max(n-PolicyInlineIntervals, 0) + PolicyChunkIntervals - 1) / PolicyChunkIntervals
		if len(chunks) != wantChunks {
			t.Errorf("%d intervals: %d chunks, want %d", n, len(chunks), wantChunks)
		}
		byKey := map[string][]byte{}
		for _, c := range chunks {
			if len(c.Key) != PolicyChunkKeySize || len(c.Value) != PolicyChunkValueSize {
				t.Fatalf("chunk of %d/%d bytes", len(c.Key), len(c.Value))
			}
			byKey[string(c.Key)] = c.Value
		}
		back, err := UnmarshalPolicyValue(b, func(k []byte) ([]byte, error) {
			if v, ok := byKey[string(k)]; ok {
				return v, nil
			}
			return nil, ErrChunkMissing
		})
		if err != nil || !reflect.DeepEqual(back.Intervals, v.Intervals) {
			t.Errorf("%d intervals: round trip: %d intervals, %v", n, len(back.Intervals), err)
		}
		if wantChunks > 0 {
			if _, err := UnmarshalPolicyValue(b, nil); !errors.Is(err, ErrChunkMissing) {
				t.Errorf("%d intervals without chunks: %v", n, err)
			}
		}
		if got := v.Search(PortPoint(ProtocolTCP, uint16(2*n-1), true)); got != n-1 {
			t.Errorf("%d intervals: last port at %d", n, got)
		}
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

func TestIntervalText(t *testing.T) {
	tcp := ProtocolTCP << 16
	for _, tc := range []struct {
		iv   Interval
		want string
	}{
		{Interval{Lo: 0, Hi: PortSpaceEnd}, "any"},
		{Interval{Lo: tcp | 80, Hi: tcp | 80}, "tcp/80"},
		{Interval{Lo: tcp | 80, Hi: tcp | 90}, "tcp/80-90"},
		{Interval{Lo: tcp, Hi: tcp | 0xffff}, "tcp/*"},
		{Interval{Lo: 0, Hi: tcp | 8079}, "0-5/*,tcp/0-8079"},
		{Interval{Lo: tcp | 8081, Hi: PortSpaceEnd}, "tcp/8081-65535,7-255/*"},
		{Interval{Lo: ProtocolUDP << 16, Hi: ProtocolUDP<<16 | 0xffff + 1<<16}, "17-18/*"},
	} {
		if got := IntervalText(tc.iv); got != tc.want {
			t.Errorf("%#x-%#x: %q, want %q", tc.iv.Lo, tc.iv.Hi, got, tc.want)
		}
	}
}
