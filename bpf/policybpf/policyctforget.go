package policybpf

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"unsafe"

	"github.com/cilium/ebpf"
)

// policyCTBatch is how many connections one batch syscall reads or
// deletes: a walk of the default 512k connections is 128 syscalls, not
// 512k (BPF_MAP_GET_NEXT_KEY, one a key).
const policyCTBatch = 4096

// rawEntries is a slice of n elements of size bytes (a [size]byte array
// type made at run time: the key size is the map's), which the batch
// syscalls read and write in place, and the bytes behind it.
func rawEntries(n, size int) (any, []byte) {
	v := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(size, reflect.TypeFor[byte]())), n, n)
	return v.Interface(), unsafe.Slice((*byte)(v.UnsafePointer()), n*size)
}

// policyCTKeys calls visit with each key of the map (a copy it may keep),
// in batches of policyCTBatch; a kernel without batch operations on the
// map is walked key by key.
func policyCTKeys(m *ebpf.Map, visit func(key []byte)) error {
	ks := int(m.KeySize())
	keys, kb := rawEntries(policyCTBatch, ks)
	values, _ := rawEntries(policyCTBatch, int(m.ValueSize()))
	var cursor ebpf.MapBatchCursor
	for first := true; ; first = false {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		if first && errors.Is(err, ebpf.ErrNotSupported) {
			return policyCTKeysOneByOne(m, visit)
		}
		for i := range n {
			visit(slices.Clone(kb[i*ks : (i+1)*ks]))
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil // the end
		}
		if err != nil {
			return err
		}
	}
}

// policyCTKeysOneByOne walks the map with BPF_MAP_GET_NEXT_KEY.
func policyCTKeysOneByOne(m *ebpf.Map, visit func(key []byte)) error {
	key := make([]byte, m.KeySize())
	var cursor any
	for range m.MaxEntries() + 1 {
		if err := m.NextKey(cursor, key); err != nil {
			if !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
			return nil
		}
		visit(slices.Clone(key))
		cursor = slices.Clone(key)
	}
	return nil
}

// deletePolicyCTKeys deletes the keys, in batches; a key gone meanwhile
// (the connection ended, or evicted) is no error. It returns how many of
// the keys are no longer in the map.
func deletePolicyCTKeys(m *ebpf.Map, stale [][]byte) (int, error) {
	ks := int(m.KeySize())
	keys, kb := rawEntries(policyCTBatch, ks)
	done := 0
	for len(stale) > 0 {
		chunk := stale[:min(len(stale), policyCTBatch)]
		for i, k := range chunk {
			copy(kb[i*ks:], k)
		}
		batch := reflect.ValueOf(keys).Slice(0, len(chunk)).Interface()
		n, err := m.BatchDelete(batch, nil)
		switch {
		case err == nil:
			n = len(chunk)
		case errors.Is(err, ebpf.ErrKeyNotExist) && n < len(chunk):
			n++ // chunk[n] was gone already: the rest is tried next
		case errors.Is(err, ebpf.ErrNotSupported):
			for _, k := range chunk {
				if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return done, fmt.Errorf("delete from %s: %w", PolicyCTMapName, err)
				}
				done++
			}
			stale = stale[len(chunk):]
			continue
		default:
			return done + n, fmt.Errorf("delete from %s: %w", PolicyCTMapName, err)
		}
		done += n
		stale = stale[n:]
	}
	return done, nil
}
