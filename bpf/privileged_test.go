package bpf

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
)

func TestPrivilegedKeysRoundTrip(t *testing.T) {
	v4 := openTestMap(t, IPMasqV4Spec())
	v6 := openTestMap(t, IPMasqV6Spec())
	ops := NewOps[*testEntry](map[string]*ebpf.Map{IPMasqV4MapName: v4, IPMasqV6MapName: v6})

	prefixes := []string{
		"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "0.0.0.0/0", "192.0.2.7/32",
		"fe80::/10", "100::/64", "::/0", "2001:db8::1/128", "::ffff:10.0.0.0/104",
	}
	want := map[netip.Prefix]bool{}
	for _, s := range prefixes {
		p := netip.MustParsePrefix(s)
		if err := ops.Update(context.Background(), nil, 0, newPrefixEntry(t, p)); err != nil {
			t.Fatalf("update %s: %v", p, err)
		}
		want[p] = true
	}

	got := mapPrefixes(t, v4)
	for p := range mapPrefixes(t, v6) {
		got[p] = true
	}
	if len(got) != len(want) {
		t.Errorf("maps hold %v, want %v", got, want)
	}
	for p := range want {
		if !got[p] {
			t.Errorf("%s missing from the maps", p)
		}
	}

	// The kernel matches the keys as LPM prefixes.
	for addr, family := range map[string]Family{"10.1.2.3": IPv4, "fe80::1": IPv6, "::ffff:10.1.1.1": IPv6} {
		a := netip.MustParseAddr(addr)
		key, err := EncodePrefix(netip.PrefixFrom(a, a.BitLen()))
		if err != nil {
			t.Fatal(err)
		}
		m := v4
		if family == IPv6 {
			m = v6
		}
		var value uint8
		if err := m.Lookup(key, &value); err != nil || value != 1 {
			t.Errorf("lookup %s: %d, %v", addr, value, err)
		}
	}
}

func TestPrivilegedUpdateBatchRefusedKey(t *testing.T) {
	m := openTestMap(t, IPMasqV4Spec())
	ops := NewOps[*testEntry](map[string]*ebpf.Map{IPMasqV4MapName: m})
	es := v4Entries(t, "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
	bad := newTestEntry(IPMasqV4MapName, badPrefixLenKey(), IPMasqValue())
	batch := batchOf(es[0], es[1], bad, es[2], es[3])

	ops.UpdateBatch(context.Background(), nil, batch)

	for _, be := range batch {
		if be.Object == bad {
			if !errors.Is(be.Result, unix.EINVAL) || !strings.Contains(be.Result.Error(), "cilium_ipmasq_v4 key 210000000a090909") {
				t.Errorf("refused key: result %v, want EINVAL naming map and key", be.Result)
			}
		} else if be.Result != nil {
			t.Errorf("%s: %v", be.Object.prefix(), be.Result)
		}
	}
	got := mapPrefixes(t, m)
	if len(got) != 4 {
		t.Errorf("map holds %v, want the 4 good prefixes", got)
	}
	for _, e := range es {
		if !got[e.prefix()] {
			t.Errorf("%s not applied", e.prefix())
		}
	}
}

func TestPrivilegedDeleteBatchMissingKey(t *testing.T) {
	m := openTestMap(t, IPMasqV4Spec())
	ops := NewOps[*testEntry](map[string]*ebpf.Map{IPMasqV4MapName: m})
	es := v4Entries(t, "10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32", "10.0.0.4/32", "10.0.0.5/32")
	present := []*testEntry{es[0], es[1], es[3], es[4]}
	ops.UpdateBatch(context.Background(), nil, batchOf(present...))

	// es[2] is missing, in the middle of the batch.
	batch := batchOf(es...)
	ops.DeleteBatch(context.Background(), nil, batch)
	for _, be := range batch {
		if be.Result != nil {
			t.Errorf("%s: %v", be.Object.prefix(), be.Result)
		}
	}
	if got := mapPrefixes(t, m); len(got) != 0 {
		t.Errorf("left in map: %v", got)
	}

	// A key the kernel refuses gets its error; the others are still deleted.
	ops.UpdateBatch(context.Background(), nil, batchOf(present...))
	bad := newTestEntry(IPMasqV4MapName, badPrefixLenKey(), IPMasqValue())
	batch = batchOf(es[0], bad, es[2], es[3])
	ops.DeleteBatch(context.Background(), nil, batch)
	if !errors.Is(batch[1].Result, unix.EINVAL) || batch[0].Result != nil || batch[2].Result != nil || batch[3].Result != nil {
		t.Errorf("results %v %v %v %v", batch[0].Result, batch[1].Result, batch[2].Result, batch[3].Result)
	}
	got := mapPrefixes(t, m)
	if len(got) != 2 || !got[es[1].prefix()] || !got[es[4].prefix()] {
		t.Errorf("left in map: %v, want %s and %s", got, es[1].prefix(), es[4].prefix())
	}
}

func TestPrivilegedPrune16384(t *testing.T) {
	m := &countingMap{Map: openTestMap(t, IPMasqV4Spec())}
	ops := NewOps[*testEntry](nil)
	ops.SetMap(IPMasqV4MapName, m)
	var all, desired []*testEntry
	for i, p := range v4Prefixes(0, IPMasqMaxEntries) {
		e := newPrefixEntry(t, p)
		all = append(all, e)
		if i%3 != 0 {
			desired = append(desired, e)
		}
	}
	batch := batchOf(all...)
	ops.UpdateBatch(context.Background(), nil, batch)
	for _, be := range batch {
		if be.Result != nil {
			t.Fatalf("fill: %v", be.Result)
		}
	}
	if got := mapPrefixes(t, m); len(got) != IPMasqMaxEntries {
		t.Fatalf("map holds %d entries, want %d", len(got), IPMasqMaxEntries)
	}

	m.reset()
	if err := ops.Prune(context.Background(), nil, entrySeq(desired...)); err != nil {
		t.Fatalf("Prune: %v", err)
	}
	// Listed with batch lookups (not key by key), deleted in one batch.
	if sc := m.syscalls.Load(); sc > IPMasqMaxEntries/listChunk+2 {
		t.Errorf("prune made %d syscalls", sc)
	}
	if d := m.deletes.Load(); d != int64(len(all)-len(desired)) {
		t.Errorf("prune deleted %d keys, want %d", d, len(all)-len(desired))
	}

	got := mapPrefixes(t, m)
	if len(got) != len(desired) {
		t.Errorf("map holds %d entries after prune, want %d", len(got), len(desired))
	}
	for _, e := range desired {
		if !got[e.prefix()] {
			t.Fatalf("desired %s was pruned", e.prefix())
		}
	}

	// Pruning against the same desired set is a no-op.
	if err := ops.Prune(context.Background(), nil, entrySeq(desired...)); err != nil {
		t.Fatalf("second Prune: %v", err)
	}
	if got := mapPrefixes(t, m); len(got) != len(desired) {
		t.Errorf("second prune changed the map: %d entries", len(got))
	}
}

func TestPrivilegedOpenPinned(t *testing.T) {
	dir := GlobalsDir(celltest.MountBPFFS(t))
	var logBuf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logBuf, nil))

	// Created and pinned when missing, directory included.
	m1, err := OpenPinned(log, IPMasqV4Spec(), dir)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer m1.Close()
	key, _ := EncodePrefix(netip.MustParsePrefix("10.0.0.0/8"))
	if err := m1.Put(key, uint8(1)); err != nil {
		t.Fatal(err)
	}
	info1, err := m1.Info()
	if err != nil {
		t.Fatal(err)
	}
	id1, _ := info1.ID()

	// A compatible pin is reused with its contents.
	m2, err := OpenPinned(log, IPMasqV4Spec(), dir)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer m2.Close()
	info2, _ := m2.Info()
	if id2, _ := info2.ID(); id2 != id1 {
		t.Errorf("compatible pin not reused: map id %d, was %d", id2, id1)
	}
	var v uint8
	if err := m2.Lookup(key, &v); err != nil || v != 1 {
		t.Errorf("reused map lost its entry: %d, %v", v, err)
	}
	if logBuf.Len() != 0 {
		t.Errorf("unexpected log output: %s", logBuf.String())
	}

	// Another size is the same map resized: a new map, its entries copied
	// before the pin moves to it.
	bigger := IPMasqV4Spec()
	bigger.MaxEntries = 2 * IPMasqMaxEntries
	m3, err := OpenPinned(log, bigger, dir)
	if err != nil {
		t.Fatalf("resize: %v", err)
	}
	defer m3.Close()
	if m3.MaxEntries() != 2*IPMasqMaxEntries {
		t.Errorf("resized map has max entries %d", m3.MaxEntries())
	}
	if err := m3.Lookup(key, &v); err != nil || v != 1 {
		t.Errorf("resized map lost its entry: %d, %v", v, err)
	}
	out := logBuf.String()
	for _, want := range []string{"level=INFO", "Resized pinned BPF map", "entries=1", "max=16384", "max=32768", filepath.Join(dir, IPMasqV4MapName)} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q does not mention %q", out, want)
		}
	}
	pinnedMax := func() uint32 {
		t.Helper()
		pinned, err := ebpf.LoadPinnedMap(filepath.Join(dir, IPMasqV4MapName), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer pinned.Close()
		return pinned.MaxEntries()
	}
	if got := pinnedMax(); got != 2*IPMasqMaxEntries {
		t.Errorf("pin still points at the old map (max entries %d)", got)
	}
	if _, err := os.Stat(filepath.Join(dir, IPMasqV4MapName+"_resizing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary pin left behind: %v", err)
	}

	// Too small for what it holds: kept as it is, with a warning.
	logBuf.Reset()
	key2, _ := EncodePrefix(netip.MustParsePrefix("172.16.0.0/12"))
	if err := m3.Put(key2, uint8(1)); err != nil {
		t.Fatal(err)
	}
	tiny := IPMasqV4Spec()
	tiny.MaxEntries = 1
	m4, err := OpenPinned(log, tiny, dir)
	if err != nil {
		t.Fatalf("shrink: %v", err)
	}
	defer m4.Close()
	if m4.MaxEntries() != 2*IPMasqMaxEntries || pinnedMax() != 2*IPMasqMaxEntries {
		t.Errorf("a map of 1 entry replaced one holding 2 (max entries %d)", m4.MaxEntries())
	}
	if out := logBuf.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "kept at its old size") {
		t.Errorf("no warning for a shrink that does not fit: %q", out)
	}

	// Another layout is replaced by a fresh map, with a warning.
	logBuf.Reset()
	other := IPMasqV4Spec()
	other.ValueSize = 2
	m5, err := OpenPinned(log, other, dir)
	if err != nil {
		t.Fatalf("replace: %v", err)
	}
	defer m5.Close()
	if m5.ValueSize() != 2 {
		t.Errorf("replacement has value size %d", m5.ValueSize())
	}
	if err := m5.Lookup(key, make([]byte, 2)); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("replacement map is not fresh: %v", err)
	}
	out = logBuf.String()
	for _, want := range []string{"level=WARN", "Replacing incompatible pinned BPF map", "value=1", "value=2"} {
		if !strings.Contains(out, want) {
			t.Errorf("warning %q does not mention %q", out, want)
		}
	}
}

// A pinned ipmasq map without BPF_F_RDONLY_PROG (an older enimasq, or one
// Cilium reused) is kept as is: replacing it would strand a loaded datapath
// on the old map. Any other difference still replaces it.
func TestPrivilegedOpenPinnedKeepsMapWithoutReadOnlyProg(t *testing.T) {
	dir := GlobalsDir(celltest.MountBPFFS(t))
	var logBuf strings.Builder
	log := slog.New(slog.NewTextHandler(&logBuf, nil))

	old := IPMasqV4Spec()
	old.Flags &^= unix.BPF_F_RDONLY_PROG
	m1, err := OpenPinned(log, old, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m1.Close()
	info1, _ := m1.Info()
	id1, _ := info1.ID()

	m2, err := OpenPinned(log, IPMasqV4Spec(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	info2, _ := m2.Info()
	if id2, _ := info2.ID(); id2 != id1 || logBuf.Len() != 0 {
		t.Errorf("map without BPF_F_RDONLY_PROG replaced (id %d, was %d): %s", id2, id1, logBuf.String())
	}
}
