package bpffake

import (
	"encoding/binary"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/bpf"
)

// FakeMap is an in-memory stand-in for an LPM trie with the kernel's error
// behaviour: EINVAL for a prefix length past the data, ENOSPC when full,
// ENOENT (ErrKeyNotExist) when deleting a missing key, and batch operations
// that stop at the first failing element. It lets the batch logic, the
// reconcilers and the script tests run without root (see [FakeStore]).
type FakeMap struct {
	mu         sync.Mutex
	keySize    int
	valueSize  int
	maxEntries int
	entries    map[string][]byte // canonical key -> value
	spec       *ebpf.MapSpec     // what it was made from, if from a spec
	id         uint32            // set by the FakeStore that made it
	// hash: a hash map (a spec of type Hash, as the chunk maps): keys are
	// exact, with no prefix length.
	hash bool
}

var _ bpf.Map = (*FakeMap)(nil)

// NewFakeMap returns an empty fake LPM trie of the given sizes.
func NewFakeMap(keySize, valueSize, maxEntries int) *FakeMap {
	return &FakeMap{keySize: keySize, valueSize: valueSize, maxEntries: maxEntries, entries: map[string][]byte{}}
}

// NewFakeMapFromSpec returns an empty fake LPM trie of spec's sizes.
func NewFakeMapFromSpec(spec *ebpf.MapSpec) *FakeMap {
	f := NewFakeMap(int(spec.KeySize), int(spec.ValueSize), int(spec.MaxEntries))
	f.spec = spec.Copy()
	f.hash = spec.Type == ebpf.Hash
	return f
}

func (f *FakeMap) KeySize() uint32    { return uint32(f.keySize) }
func (f *FakeMap) ValueSize() uint32  { return uint32(f.valueSize) }
func (f *FakeMap) MaxEntries() uint32 { return uint32(f.maxEntries) }

// elems returns the bytes of a []byte or a slice of byte arrays.
func elems(v any) []byte {
	if b, ok := v.([]byte); ok {
		return b
	}
	rv := reflect.ValueOf(v)
	if rv.Len() == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(rv.UnsafePointer()), rv.Len()*int(rv.Type().Elem().Size()))
}

func (f *FakeMap) canonical(key []byte) (string, error) {
	if len(key) != f.keySize {
		return "", fmt.Errorf("key of %d bytes: %w", len(key), unix.EINVAL)
	}
	if f.hash {
		return string(key), nil
	}
	if binary.NativeEndian.Uint32(key) > uint32(f.keySize-bpf.PrefixLenSize)*8 {
		return "", unix.EINVAL
	}
	k := append([]byte(nil), key...)
	bpf.CanonicalizeLPMKey(k)
	return string(k), nil
}

func (f *FakeMap) put(key, value []byte) error {
	k, err := f.canonical(key)
	if err != nil {
		return err
	}
	if _, ok := f.entries[k]; !ok && len(f.entries) >= f.maxEntries {
		return unix.ENOSPC
	}
	f.entries[k] = append([]byte(nil), value...)
	return nil
}

func (f *FakeMap) del(key []byte) error {
	k, err := f.canonical(key)
	if err != nil {
		return err
	}
	if _, ok := f.entries[k]; !ok {
		return fmt.Errorf("%w (%w)", ebpf.ErrKeyNotExist, unix.ENOENT)
	}
	delete(f.entries, k)
	return nil
}

func (f *FakeMap) Put(key, value any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.put(elems(key), elems(value)); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	return nil
}

func (f *FakeMap) Delete(key any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.del(elems(key)); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	return nil
}

func (f *FakeMap) BatchUpdate(keys, values any, _ *ebpf.BatchOptions) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k, v := elems(keys), elems(values)
	n := len(k) / f.keySize
	for i := range n {
		if err := f.put(k[i*f.keySize:(i+1)*f.keySize], v[i*f.valueSize:(i+1)*f.valueSize]); err != nil {
			return i, fmt.Errorf("batch update: %w", err)
		}
	}
	return n, nil
}

func (f *FakeMap) BatchDelete(keys any, _ *ebpf.BatchOptions) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := elems(keys)
	n := len(k) / f.keySize
	for i := range n {
		if err := f.del(k[i*f.keySize : (i+1)*f.keySize]); err != nil {
			return i, fmt.Errorf("batch delete: %w", err)
		}
	}
	return n, nil
}

// BatchLookup returns every key in one call, as a small trie would.
func (f *FakeMap) BatchLookup(_ *ebpf.MapBatchCursor, keysOut, valuesOut any, _ *ebpf.BatchOptions) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := f.sortedKeys()
	out := elems(keysOut)
	if len(keys)*f.keySize > len(out) {
		return 0, fmt.Errorf("fake: %d keys do not fit in one lookup", len(keys))
	}
	for i, k := range keys {
		copy(out[i*f.keySize:], k)
	}
	return len(keys), fmt.Errorf("map batch lookup: %w", ebpf.ErrKeyNotExist)
}

func (f *FakeMap) NextKey(key, nextKeyOut any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := f.sortedKeys()
	i := 0
	if key != nil {
		cur := string(elems(key))
		i = sort.SearchStrings(keys, cur)
		if i < len(keys) && keys[i] == cur {
			i++
		}
	}
	if i >= len(keys) {
		return ebpf.ErrKeyNotExist
	}
	copy(elems(nextKeyOut), keys[i])
	return nil
}

func (f *FakeMap) sortedKeys() []string {
	keys := make([]string, 0, len(f.entries))
	for k := range f.entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Lookup copies into valueOut the value of the longest stored prefix that
// contains key's prefix, as the kernel's lookup in an LPM trie does.
func (f *FakeMap) Lookup(key, valueOut any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k, err := f.canonical(elems(key))
	if err != nil {
		return fmt.Errorf("lookup: %w", err)
	}
	if f.hash {
		v, ok := f.entries[k]
		if !ok {
			return fmt.Errorf("lookup: %w", ebpf.ErrKeyNotExist)
		}
		copy(elems(valueOut), v)
		return nil
	}
	best, bestLen := []byte(nil), -1
	for stored, v := range f.entries {
		if n := lpmLen(stored); n > bestLen && n <= lpmLen(k) && lpmCovers(stored, k) {
			best, bestLen = v, n
		}
	}
	if best == nil {
		return fmt.Errorf("lookup: %w", ebpf.ErrKeyNotExist)
	}
	copy(elems(valueOut), best)
	return nil
}

func lpmLen(key string) int { return int(binary.NativeEndian.Uint32([]byte(key[:bpf.PrefixLenSize]))) }

// lpmCovers says whether the prefix of stored holds the data of key.
func lpmCovers(stored, key string) bool {
	n := lpmLen(stored)
	a, b := stored[bpf.PrefixLenSize:], key[bpf.PrefixLenSize:]
	for i := 0; n > 0; i, n = i+1, n-8 {
		mask := byte(0xff)
		if n < 8 {
			mask = byte(0xff) << (8 - n)
		}
		if a[i]&mask != b[i]&mask {
			return false
		}
	}
	return true
}

// Close does nothing: the fake lives while it is referenced.
func (f *FakeMap) Close() error { return nil }

// lookup returns the value stored at exactly key.
// Get is the value stored for key (canonicalized), if any.
func (f *FakeMap) Get(key []byte) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k, err := f.canonical(key)
	if err != nil {
		return nil, false
	}
	v, ok := f.entries[k]
	return v, ok
}

// Len is the number of entries.
func (f *FakeMap) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.entries)
}
