package bpf

import (
	"fmt"
	"sync"

	"github.com/cilium/statedb/reconciler"
)

// A Spiller is an [Entry] whose value continues in another map: a policy
// value longer than a map value holds its other intervals in chunks of a
// chunk map (policybpf). [Ops] writes an entry's spill entries before
// the entry, so that the kernel never holds an entry whose chunks are not
// there yet, and prunes the spill map against the spill entries of the
// desired objects. Spill entries are content-addressed: one key always has
// one value, and entries with the same value share them.
type Spiller interface {
	// SpillMap names the map of the spill entries ("" when there are none).
	SpillMap() string
	// Spill returns the spill entries; the operations never modify them.
	Spill() []SpillEntry
}

// spillState is what Ops remembers of spill maps: their names (pruned by
// key as written, not as LPM keys) and the keys written since the last
// prune, which a later entry with the same chunks need not write again.
type spillState struct {
	mu      sync.Mutex
	maps    map[string]bool
	written map[string]struct{}
	held    map[string]*spillHeld // the keys each open spill map holds (count.go)
	refs    spillRefs             // the entries that hold each chunk (spillrefs.go)
	// pre are, per spill map, the chunks it held when it was set and
	// still holds: never deleted by refs (count.go).
	pre map[string]map[string]struct{}
}

// SetSpillMap declares name a spill map: Prune compares its keys as they
// are, not as LPM keys. The map itself is added with SetMap.
func (o *Ops[E]) SetSpillMap(name string) {
	o.spill.mu.Lock()
	defer o.spill.mu.Unlock()
	if o.spill.maps == nil {
		o.spill.maps = map[string]bool{}
	}
	o.spill.maps[name] = true
}

func (o *Ops[E]) isSpillMap(name string) bool {
	o.spill.mu.Lock()
	defer o.spill.mu.Unlock()
	return o.spill.maps[name]
}

// forgetSpills forgets which spill keys were written: after a prune, a
// key may be gone. The keys the spill maps hold are counted again.
func (o *Ops[E]) forgetSpills() {
	o.spill.mu.Lock()
	o.spill.written = nil
	o.spill.mu.Unlock()
	o.recountSpills()
}

// writeSpill writes the spill entries of e (if it is a Spiller) that were
// not written since the last prune.
func (o *Ops[E]) writeSpill(e E) error {
	name, entries := spillsOf(e)
	if len(entries) == 0 {
		return nil
	}
	m, err := o.mapFor(name)
	if err != nil {
		return fmt.Errorf("spill of %s key %s: %w", e.MapName(), describeKey(e.MapKey()), err)
	}
	for _, se := range entries {
		id := spillID(name, se.Key)
		o.spill.mu.Lock()
		_, done := o.spill.written[id]
		o.spill.mu.Unlock()
		if done {
			continue
		}
		if err := checkSizes(m, name, se.Key, se.Value); err != nil {
			return err
		}
		if err := m.Put(se.Key, se.Value); err != nil {
			return fmt.Errorf("spill of %s key %s: %w", e.MapName(), describeKey(e.MapKey()), opError("update", name, se.Key, err))
		}
		o.spill.mu.Lock()
		if o.spill.written == nil {
			o.spill.written = map[string]struct{}{}
		}
		o.spill.written[id] = struct{}{}
		o.holdSpill(name, se.Key)
		o.spill.mu.Unlock()
	}
	return nil
}

// writeSpills writes the spill entries of a batch's objects; an object
// whose spill fails gets the error as its result and true in the returned
// slice (its entry is not written).
func (o *Ops[E]) writeSpills(batch []reconciler.BatchEntry[E]) []bool {
	var failed []bool
	for i := range batch {
		if err := o.writeSpill(batch[i].Object); err != nil {
			if failed == nil {
				failed = make([]bool, len(batch))
			}
			failed[i] = true
			batch[i].Result = err
		}
	}
	return failed
}

// spillsOf is an entry's spill map and spill entries (none if it is no
// Spiller).
func spillsOf(e Entry) (string, []SpillEntry) {
	s, ok := any(e).(Spiller)
	if !ok {
		return "", nil
	}
	return s.SpillMap(), s.Spill()
}

// spillID names a spill entry in the spill state: its map and key.
func spillID(name string, key []byte) string { return name + "\x00" + string(key) }

// SpillEntry is a key and value of another map that a map entry's value
// refers to (a chunk).
type SpillEntry struct {
	Key, Value []byte
}
