package bpf

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// Entry is a statedb object that is one entry of a BPF map.
type Entry interface {
	// MapName names the map the entry belongs in (e.g. "cilium_ipmasq_v4").
	// "" means the entry is not programmed: the operations skip it.
	MapName() string
	// MapKey returns the kernel key bytes. The operations never modify them.
	MapKey() []byte
	// MapValue returns the kernel value bytes. The operations never modify
	// them.
	MapValue() []byte
}

// Map is the part of *ebpf.Map that [Ops] uses. *ebpf.Map implements it; tests
// and benchmarks wrap it to count or fail operations.
type Map interface {
	KeySize() uint32
	ValueSize() uint32
	MaxEntries() uint32
	Put(key, value any) error
	Delete(key any) error
	NextKey(key, nextKeyOut any) error
	BatchUpdate(keys, values any, opts *ebpf.BatchOptions) (int, error)
	BatchDelete(keys any, opts *ebpf.BatchOptions) (int, error)
	BatchLookup(cursor *ebpf.MapBatchCursor, keysOut, valuesOut any, opts *ebpf.BatchOptions) (int, error)
}

var _ Map = (*ebpf.Map)(nil)

// ReconcilerOps is what the statedb reconciler calls: single and batch
// operations. [Ops] and [FaultInjector] implement it.
type ReconcilerOps[E any] interface {
	reconciler.Operations[E]
	reconciler.BatchOperations[E]
}

// Ops reconciles a statedb table of [Entry] objects into one or more LPM-trie
// maps, chosen per object by [Entry.MapName]. It implements
// [reconciler.Operations] and [reconciler.BatchOperations].
//
// Every entry gets its own result: a key the kernel refuses fails alone, the
// rest of its batch is applied, and pruning deletes stale keys regardless.
// The zero value has no maps; add them with SetMap.
type Ops[E Entry] struct {
	mu    sync.Mutex                     // serializes SetMap
	maps  atomic.Pointer[map[string]Map] // copy-on-write, read lock-free
	spill spillState
	keep  atomic.Pointer[KeepFunc]
}

// KeepFunc is asked, at the start of each prune, for the function that
// says which keys no desired object holds are to be kept all the same
// (keys the kernel still uses: SetKeep). The maps are pruned in order,
// spill maps last.
type KeepFunc func(txn statedb.ReadTxn) func(mapName string, key []byte) bool

// SetKeep sets the keys a prune keeps though no desired object holds them
// (nil: none).
func (o *Ops[E]) SetKeep(k KeepFunc) {
	if k == nil {
		o.keep.Store(nil)
		return
	}
	o.keep.Store(&k)
}

var _ ReconcilerOps[Entry] = (*Ops[Entry])(nil)

// NewOps returns operations over the given maps, keyed by map name. Nil maps
// are left out.
func NewOps[E Entry](maps map[string]*ebpf.Map) *Ops[E] {
	o := &Ops[E]{}
	m := make(map[string]Map, len(maps))
	for name, mp := range maps {
		if mp != nil {
			m[name] = mp
		}
	}
	o.maps.Store(&m)
	return o
}

// SetMap adds, replaces or (with a nil m) removes the map of the given name.
// It is safe to call while the reconciler runs.
func (o *Ops[E]) SetMap(name string, m Map) {
	o.mu.Lock()
	defer o.mu.Unlock()
	next := maps.Clone(o.snapshot())
	if next == nil {
		next = map[string]Map{}
	}
	if m == nil {
		delete(next, name)
	} else {
		next[name] = m
	}
	o.maps.Store(&next)
	if o.isSpillMap(name) {
		o.recountSpill(name, m) // count the chunks it holds (count.go)
	}
}

func (o *Ops[E]) snapshot() map[string]Map {
	if m := o.maps.Load(); m != nil {
		return *m
	}
	return nil
}

// Update writes the entry into its map. An entry with no map name is skipped.
func (o *Ops[E]) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, e E) error {
	m, err := o.mapOf(e)
	if m == nil || err != nil {
		return err
	}
	name, key, value := e.MapName(), e.MapKey(), e.MapValue()
	if err := checkSizes(m, name, key, value); err != nil {
		return err
	}
	if err := o.writeSpill(e); err != nil {
		return err
	}
	if err := m.Put(key, value); err != nil {
		return opError("update", name, key, err)
	}
	o.written(e)
	return nil
}

// Delete removes the entry from its map. A key that is already gone is
// success; an entry with no map name is skipped.
func (o *Ops[E]) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, e E) error {
	m, err := o.mapOf(e)
	if m == nil || err != nil {
		return err
	}
	name, key := e.MapName(), e.MapKey()
	if err := checkKeySize(m, name, key); err != nil {
		return err
	}
	if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return opError("delete", name, key, err)
	}
	o.deleted(e)
	return nil
}

// mapOf is the map of an entry: nil without an error for an entry with no
// map name (skipped), an error when its map is not open.
func (o *Ops[E]) mapOf(e E) (Map, error) {
	if e.MapName() == "" {
		return nil, nil
	}
	return o.mapFor(e.MapName())
}

func (o *Ops[E]) mapFor(name string) (Map, error) {
	if m, ok := o.snapshot()[name]; ok {
		return m, nil
	}
	return nil, fmt.Errorf("map %s not open", name)
}

func checkKeySize(m Map, name string, key []byte) error {
	if len(key) != int(m.KeySize()) {
		return fmt.Errorf("map %s key %s: %d bytes, map takes %d", name, describeKey(key), len(key), m.KeySize())
	}
	return nil
}

func checkSizes(m Map, name string, key, value []byte) error {
	if err := checkKeySize(m, name, key); err != nil {
		return err
	}
	if len(value) != int(m.ValueSize()) {
		return fmt.Errorf("map %s key %s: value of %d bytes, map takes %d", name, describeKey(key), len(value), m.ValueSize())
	}
	return nil
}

func opError(op, mapName string, key []byte, err error) error {
	return fmt.Errorf("%s %s key %s: %w", op, mapName, describeKey(key), err)
}
