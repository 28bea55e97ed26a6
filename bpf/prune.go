package bpf

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
)

// listChunk is how many keys one BPF_MAP_LOOKUP_BATCH call returns at most.
const listChunk = 4096

// Prune deletes from every map the ops know the keys that no desired object
// holds (objects with an empty or unknown map name hold none).
//
// Each map is listed completely before anything is deleted from it: deleting
// while walking an LPM trie skips keys. Keys are compared with the data bits
// past their prefix length cleared, as the kernel matches them. A key that
// cannot be deleted does not stop the deletion of the others; all failures
// come back joined. Prune only deletes: a present key with a stale value is
// fixed by Update when the object is refreshed.
func (o *Ops[E]) Prune(ctx context.Context, txn statedb.ReadTxn, objects iter.Seq2[E, statedb.Revision]) error {
	open := o.snapshot()
	if len(open) == 0 {
		return nil
	}
	desired := make(map[string]map[string]struct{}, len(open))
	for name := range open {
		desired[name] = map[string]struct{}{}
	}
	var scratch []byte
	for obj := range objects {
		if s, ok := any(obj).(Spiller); ok {
			if set, ok := desired[s.SpillMap()]; ok {
				for _, se := range s.Spill() {
					set[string(se.Key)] = struct{}{}
				}
			}
		}
		set, ok := desired[obj.MapName()]
		if !ok {
			continue
		}
		scratch = append(scratch[:0], obj.MapKey()...)
		CanonicalizeLPMKey(scratch)
		set[string(scratch)] = struct{}{}
	}
	// The spill maps are pruned last: an entry is deleted before its
	// chunks. After the prune a chunk written before may be gone.
	defer o.forgetSpills()

	keep := func(string, []byte) bool { return false }
	if k := o.keep.Load(); k != nil {
		keep = (*k)(txn) // the snapshot the desired objects are read from
	}
	var errs []error
	names := slices.SortedFunc(maps.Keys(open), func(a, b string) int {
		if sa, sb := o.isSpillMap(a), o.isSpillMap(b); sa != sb {
			if sa {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("prune %s: %w", name, err))
			break
		}
		if err := pruneMap(ctx, name, open[name], desired[name], !o.isSpillMap(name), keep); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func pruneMap(ctx context.Context, name string, m Map, desired map[string]struct{}, lpm bool, keep func(string, []byte) bool) error {
	keys, err := listKeys(m)
	if err != nil {
		return fmt.Errorf("prune %s: %w", name, err)
	}
	// Move the undesired keys to the front of the buffer, in listing order.
	stale := 0
	for j := range keys.len() {
		key := keys.at(j)
		if lpm {
			CanonicalizeLPMKey(key)
		}
		if _, ok := desired[string(key)]; ok || keep(name, key) {
			continue
		}
		keys.set(stale, key)
		stale++
	}
	keys = keys.head(stale)

	var errs []error
	deleteKeys(ctx, m, keys, func(j int, err error) {
		errs = append(errs, opError("prune", name, keys.at(j), err))
	})
	return errors.Join(errs...)
}

// listKeys returns every key of an LPM map. It uses batch lookups where the
// kernel has them and walks the keys one by one otherwise. It fails rather
// than return more keys than the map can hold (a map changing under the walk
// can make the kernel restart it).
func listKeys(m Map) (batchBuf, error) {
	keySize, limit := int(m.KeySize()), int(m.MaxEntries())
	var all []byte
	err := batchList(m, func(keys, _ batchBuf, n int) error {
		all = append(all, keys.raw[:n*keySize]...)
		if len(all) > limit*keySize {
			return fmt.Errorf("list keys: more than the %d entries the map holds", limit)
		}
		return nil
	})
	if errors.Is(err, ebpf.ErrNotSupported) {
		return walkKeys(m, limit)
	}
	if err != nil {
		return batchBuf{}, err
	}
	return batchBufOf(keySize, all), nil
}

// batchList reads every entry of m with batch lookups, handing each batch
// (n keys and values) to each; ebpf.ErrNotSupported when the kernel has no
// batch lookup for the map.
func batchList(m Map, each func(keys, values batchBuf, n int) error) error {
	chunk := max(1, min(int(m.MaxEntries()), listChunk))
	keys := newBatchBuf(int(m.KeySize()), chunk)
	values := newBatchBuf(int(m.ValueSize()), chunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys.slice.Interface(), values.slice.Interface(), nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			return err
		}
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("list keys: %w", err)
		}
		if eachErr := each(keys, values, n); eachErr != nil {
			return eachErr
		}
		if err != nil { // ErrKeyNotExist: the walk is complete.
			return nil
		}
	}
}

// walkKeys lists the keys with BPF_MAP_GET_NEXT_KEY, one syscall per key.
func walkKeys(m Map, limit int) (batchBuf, error) {
	keySize := int(m.KeySize())
	var all []byte
	next := make([]byte, keySize)
	var prev any // nil: start from the first key
	for {
		err := m.NextKey(prev, next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return batchBufOf(keySize, all), nil
		}
		if err != nil {
			return batchBuf{}, fmt.Errorf("list keys: %w", err)
		}
		all = append(all, next...)
		if len(all) > limit*keySize {
			return batchBuf{}, fmt.Errorf("list keys: more than the %d entries the map holds", limit)
		}
		prev = all[len(all)-keySize:]
	}
}

// Keys returns every key of an LPM map, each in a slice of its own, for the
// listings that read the kernel (script commands, enimasq-dbg).
func Keys(m Map) ([][]byte, error) {
	keys, err := listKeys(m)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, keys.len())
	for i := range out {
		out[i] = slices.Clone(keys.at(i))
	}
	return out, nil
}
