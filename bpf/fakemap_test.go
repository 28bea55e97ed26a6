package bpf

import (
	"encoding/binary"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// fakeMap is an in-memory stand-in for an LPM trie with the kernel's error
// behaviour: EINVAL for a prefix length past the data, ENOSPC when full,
// ENOENT (ErrKeyNotExist) when deleting a missing key, and batch operations
// that stop at the first failing element. It lets the batch logic be tested
// without root.
type fakeMap struct {
	mu         sync.Mutex
	keySize    int
	valueSize  int
	maxEntries int
	entries    map[string][]byte // canonical key -> value
}

var _ Map = (*fakeMap)(nil)

func newFakeMap(keySize, valueSize, maxEntries int) *fakeMap {
	return &fakeMap{keySize: keySize, valueSize: valueSize, maxEntries: maxEntries, entries: map[string][]byte{}}
}

func (f *fakeMap) KeySize() uint32    { return uint32(f.keySize) }
func (f *fakeMap) ValueSize() uint32  { return uint32(f.valueSize) }
func (f *fakeMap) MaxEntries() uint32 { return uint32(f.maxEntries) }

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

func (f *fakeMap) canonical(key []byte) (string, error) {
	if len(key) != f.keySize {
		return "", fmt.Errorf("key of %d bytes: %w", len(key), unix.EINVAL)
	}
	if binary.NativeEndian.Uint32(key) > uint32(f.keySize-prefixLenSize)*8 {
		return "", unix.EINVAL
	}
	k := append([]byte(nil), key...)
	canonicalizeLPMKey(k)
	return string(k), nil
}

func (f *fakeMap) put(key, value []byte) error {
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

func (f *fakeMap) del(key []byte) error {
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

func (f *fakeMap) Put(key, value any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.put(elems(key), elems(value)); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	return nil
}

func (f *fakeMap) Delete(key any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.del(elems(key)); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	return nil
}

func (f *fakeMap) BatchUpdate(keys, values any, _ *ebpf.BatchOptions) (int, error) {
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

func (f *fakeMap) BatchDelete(keys any, _ *ebpf.BatchOptions) (int, error) {
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
func (f *fakeMap) BatchLookup(_ *ebpf.MapBatchCursor, keysOut, valuesOut any, _ *ebpf.BatchOptions) (int, error) {
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

func (f *fakeMap) NextKey(key, nextKeyOut any) error {
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

func (f *fakeMap) sortedKeys() []string {
	keys := make([]string, 0, len(f.entries))
	for k := range f.entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// lookup returns the value stored at exactly key.
func (f *fakeMap) lookup(key []byte) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k, err := f.canonical(key)
	if err != nil {
		return nil, false
	}
	v, ok := f.entries[k]
	return v, ok
}

func (f *fakeMap) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.entries)
}
