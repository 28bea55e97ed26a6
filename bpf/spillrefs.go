package bpf

import (
	"errors"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb/reconciler"
)

// Chunks go with the entries that hold them. A spill entry (a chunk) is
// shared by every entry with the same intervals, so it can go only when the
// last entry the kernel holds with it is deleted or rewritten without it.
// Ops counts, per spill key, the entries it wrote that hold it (as the
// kernel has them: only successful writes and deletes count) and deletes a
// chunk from its map as soon as that count drops to zero, after the entry
// that held it is gone from the kernel: a packet never meets an entry
// whose chunk is missing. Left to the prune, a version's chunks stayed for
// a whole refresh interval, and pods churning through versions filled the
// chunk map and stalled every pod's new chunks.
//
// Chunks no entry of this run wrote (an earlier run's, or written for an
// entry whose own write then failed) are not counted: the prune deletes
// them against the desired objects, as before. Nor are those the map held
// when it was set, even once entries of this run hold them too: entries
// this run never wrote (an earlier run's versions in force, kept until
// taken over) may hold them, and only the prune knows which it keeps.

// spillRefs is the counts, kept under spillState.mu.
type spillRefs struct {
	// count is, per spill id (map name NUL key), the entries that hold it.
	count map[string]int
	// heldBy is, per map and key of an entry with any chunk, the spill ids
	// of the value the kernel holds for it.
	heldBy map[string]map[string][]string
}

func spillIDs(e Entry) []string {
	name, entries := spillsOf(e)
	if len(entries) == 0 {
		return nil
	}
	ids := make([]string, len(entries))
	for i, se := range entries {
		ids[i] = spillID(name, se.Key)
	}
	return ids
}

// written records that the kernel now holds the given entries as written
// (their values' chunks), and deletes the chunks no entry holds any more.
// The holds of all of them are taken before any is released, so a chunk
// that moves from one entry to another within a batch stays.
func (o *Ops[E]) written(es ...E) {
	o.account(es, nil)
}

// deleted records that the kernel no longer holds the given entries, and
// deletes the chunks no entry holds any more.
func (o *Ops[E]) deleted(es ...E) {
	o.account(nil, es)
}

func (o *Ops[E]) account(written, deleted []E) {
	o.spill.mu.Lock()
	r := &o.spill.refs
	var released []string
	for _, e := range written {
		ids := spillIDs(e)
		byKey := r.heldBy[e.MapName()]
		old, had := byKey[string(e.MapKey())]
		if len(ids) == 0 && !had {
			continue // the common case: no chunk before or now, no allocation
		}
		if r.count == nil {
			r.count = map[string]int{}
		}
		for _, s := range ids {
			r.count[s]++
		}
		released = append(released, old...)
		if len(ids) == 0 {
			delete(byKey, string(e.MapKey()))
			continue
		}
		if byKey == nil {
			if r.heldBy == nil {
				r.heldBy = map[string]map[string][]string{}
			}
			byKey = map[string][]string{}
			r.heldBy[e.MapName()] = byKey
		}
		byKey[string(e.MapKey())] = ids
	}
	for _, e := range deleted {
		byKey := r.heldBy[e.MapName()]
		if old, ok := byKey[string(e.MapKey())]; ok {
			released = append(released, old...)
			delete(byKey, string(e.MapKey()))
		}
	}
	var gone []string
	for _, s := range released {
		r.count[s]--
		if r.count[s] <= 0 {
			delete(r.count, s)
			gone = append(gone, s)
		}
	}
	o.spill.mu.Unlock()
	o.deleteSpills(gone)
}

// deleteSpills deletes chunks no entry holds. A chunk that cannot be
// deleted stays for the prune; a chunk whose entry comes back is written
// again (it is no longer among the written ones).
func (o *Ops[E]) deleteSpills(ids []string) {
	if len(ids) == 0 {
		return
	}
	maps := o.snapshot()
	for _, id := range ids {
		name, key := splitID(id)
		m, ok := maps[name]
		if !ok {
			continue
		}
		o.spill.mu.Lock()
		_, pre := o.spill.pre[name][key]
		if o.spill.refs.count[id] > 0 || pre { // held again meanwhile, or maybe by an entry of an earlier run
			o.spill.mu.Unlock()
			continue
		}
		delete(o.spill.written, id)
		o.spill.mu.Unlock()
		if err := m.Delete([]byte(key)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		o.spill.mu.Lock()
		if h := o.spill.held[name]; h != nil {
			delete(h.keys, key)
		}
		o.spill.mu.Unlock()
	}
}

func splitID(id string) (name, key string) {
	for i := 0; i < len(id); i++ {
		if id[i] == 0 {
			return id[:i], id[i+1:]
		}
	}
	return id, ""
}

// succeeded is the objects of a batch whose operation succeeded (skip:
// those not applied).
func succeeded[E Entry](batch []reconciler.BatchEntry[E], skip []bool) []E {
	out := make([]E, 0, len(batch))
	for i := range batch {
		if skip != nil && skip[i] || batch[i].Result != nil || batch[i].Object.MapName() == "" {
			continue
		}
		out = append(out, batch[i].Object)
	}
	return out
}
