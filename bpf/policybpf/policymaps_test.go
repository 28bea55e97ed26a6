package policybpf

import (
	"errors"
	"github.com/enimasq/enimasq/bpf"
	"reflect"
	"testing"
)

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
	if PolicyMapName(Ingress, bpf.IPv6) != PolicyIngressV6MapName {
		t.Error(PolicyMapName(Ingress, bpf.IPv6))
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
