package test

import (
	"errors"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/enimasq/enimasq/cells/celltest"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
)

// The ip-masq-agent path as a process: enimasq-agent running, the file
// written (a temporary file renamed over it), until the pinned
// cilium_ipmasq_v4, opened as another program on the node would, holds the
// result. The in-process benchmarks in package ipmasq time the same path
// with the peer (bulk refresh) and the floor (raw BatchUpdate) in the same
// run; these check that the process adds nothing of note.

func ipmasqFile(n int, extra ...string) string { return celltest.IPMasqAgentConfig(n, extra...) }

func masqKey(b *testing.B, p netip.Prefix) []byte {
	k, err := bpf.NewKeyV4(p)
	if err != nil {
		b.Fatal(err)
	}
	key, err := k.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	return key
}

// waitKeys polls the pinned map until every key is present (or, with gone,
// absent): the state another program on the node sees. The agent writes
// the keys in order, so the last one is polled until it is there, then all
// are checked; the poll yields 20 µs between looks so as not to take a
// core from the agent (a map of another process has no watch channel).
func waitKeys(b *testing.B, m *ebpf.Map, keys [][]byte, gone bool) {
	deadline := time.Now().Add(time.Minute)
	var v [1]byte
	there := func(k []byte) bool {
		err := m.Lookup(k, &v)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			b.Fatal(err)
		}
		return (err == nil) != gone
	}
	wait := func(k []byte, i int) {
		for !there(k) {
			if time.Now().After(deadline) {
				b.Fatalf("key %d of %d not there (gone %t)", i, len(keys), gone)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	wait(keys[len(keys)-1], len(keys)-1)
	for i, k := range keys {
		wait(k, i)
	}
}

func startIPMasqAgent(b *testing.B, content string) (*Agent, string, *ebpf.Map) {
	a := NewAgent(b)
	path := filepath.Join(a.Dir, "config", "ip-masq-agent")
	WriteFileAtomic(b, path, content)
	a.Args = append(a.Args, "--enable-ip-masq-agent", "--enable-bpf-masquerade", "--ip-masq-agent-config-path", path)
	a.Start()
	a.WaitHealthy()
	var m *ebpf.Map
	a.WaitFor("cilium_ipmasq_v4 pinned", func() bool {
		var err error
		m, err = ebpf.LoadPinnedMap(filepath.Join(bpf.GlobalsDir(a.BPFRoot), bpf.IPMasqV4MapName), &ebpf.LoadPinOptions{ReadOnly: true})
		return err == nil
	})
	b.Cleanup(func() { m.Close() })
	return a, path, m
}

// BenchmarkProcessIPMasqEdit16383: one CIDR added to a file of 16383, until
// the pinned map holds it.
func BenchmarkProcessIPMasqEdit16383(b *testing.B) {
	base := ipmasqFile(16382)
	edited := ipmasqFile(16382, "100.200.0.0/16")
	_, path, m := startIPMasqAgent(b, base)
	last := masqKey(b, netip.MustParsePrefix("10.0.63.253/32"))
	waitKeys(b, m, [][]byte{last}, false)
	extra := [][]byte{masqKey(b, netip.MustParsePrefix("100.200.0.0/16"))}
	var total time.Duration
	b.ResetTimer()
	b.StopTimer()
	for range b.N {
		start := time.Now()
		WriteFileAtomic(b, path, edited)
		waitKeys(b, m, extra, false)
		total += time.Since(start)
		WriteFileAtomic(b, path, base)
		waitKeys(b, m, extra, true)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "edit-ms")
}

// BenchmarkProcessIPMasqFullLoad16383: a file of 16383 CIDRs written over
// an empty list, until the pinned map holds every one; floor-ms is one raw
// BatchUpdate of the same keys into a new map, in the same run.
func BenchmarkProcessIPMasqFullLoad16383(b *testing.B) {
	empty := "nonMasqueradeCIDRs: []\n"
	full := ipmasqFile(16383)
	_, path, m := startIPMasqAgent(b, empty)
	keys := make([][]byte, 16383)
	batchKeys := make([][bpf.KeySizeV4]byte, 16384)
	for i := range keys {
		keys[i] = masqKey(b, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32))
		copy(batchKeys[i][:], keys[i])
	}
	copy(batchKeys[16383][:], masqKey(b, netip.MustParsePrefix("169.254.0.0/16")))
	vals := make([]byte, 16384)
	for i := range vals {
		vals[i] = bpf.IPMasqValue()[0]
	}
	var total, floor time.Duration
	b.ResetTimer()
	b.StopTimer()
	for range b.N {
		spec := bpf.IPMasqV4Spec().Copy()
		spec.Pinning = ebpf.PinNone
		raw, err := ebpf.NewMap(spec)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if n, err := raw.BatchUpdate(batchKeys, vals, nil); err != nil || n != len(vals) {
			b.Fatalf("BatchUpdate: %d, %v", n, err)
		}
		floor += time.Since(start)
		raw.Close()

		start = time.Now()
		WriteFileAtomic(b, path, full)
		waitKeys(b, m, keys, false)
		total += time.Since(start)
		WriteFileAtomic(b, path, empty)
		waitKeys(b, m, keys, true)
	}
	n := float64(b.N)
	b.ReportMetric(float64(total.Microseconds())/n/1000, "load-ms")
	b.ReportMetric(float64(floor.Microseconds())/n/1000, "floor-ms")
	b.ReportMetric(float64(total)/float64(floor), "x-floor")
}
