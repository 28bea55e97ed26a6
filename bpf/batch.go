package bpf

import (
	"context"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// UpdateBatch writes the entries into their maps, one BPF_MAP_UPDATE_BATCH
// per map. The kernel stops a batch at the first element it refuses; that
// element gets the error as its result and the batch goes on from the next
// one, so one bad entry never keeps the others out.
func (o *Ops[E]) UpdateBatch(ctx context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[E]) {
	maps := o.snapshot()
	failed := o.writeSpills(batch)
	for _, g := range groupByMap(batch, failed) {
		m, ok := maps[g.name]
		if !ok {
			failGroup(batch, g, "update")
			continue
		}
		updateGroup(ctx, g.name, m, batch, g.idx)
	}
	o.written(succeeded(batch, failed)...)
}

// DeleteBatch removes the entries from their maps, one BPF_MAP_DELETE_BATCH
// per map. A key that is already gone is success; any other refused key gets
// its error and the batch goes on from the next one.
func (o *Ops[E]) DeleteBatch(ctx context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[E]) {
	maps := o.snapshot()
	for _, g := range groupByMap(batch, nil) {
		m, ok := maps[g.name]
		if !ok {
			failGroup(batch, g, "delete")
			continue
		}
		deleteGroup(ctx, g.name, m, batch, g.idx)
	}
	o.deleted(succeeded(batch, nil)...)
}

// mapGroup is the positions in a batch of the entries of one map.
type mapGroup struct {
	name string
	idx  []int
}

// groupByMap groups the batch by map name, keeping batch order within each
// group. Entries with no map name are skipped: their result stays nil; so
// are those marked in skip (their result is set).
func groupByMap[E Entry](batch []reconciler.BatchEntry[E], skip []bool) []mapGroup {
	var groups []mapGroup
	last := -1
	for i := range batch {
		name := batch[i].Object.MapName()
		if name == "" || skip != nil && skip[i] {
			continue
		}
		if last < 0 || groups[last].name != name {
			last = -1
			for j := range groups {
				if groups[j].name == name {
					last = j
					break
				}
			}
			if last < 0 {
				// The first group usually holds the whole batch.
				capacity := len(batch) - i
				if len(groups) > 0 {
					capacity = 0
				}
				groups = append(groups, mapGroup{name: name, idx: make([]int, 0, capacity)})
				last = len(groups) - 1
			}
		}
		groups[last].idx = append(groups[last].idx, i)
	}
	return groups
}

func failGroup[E Entry](batch []reconciler.BatchEntry[E], g mapGroup, op string) {
	for _, i := range g.idx {
		batch[i].Result = opError(op, g.name, batch[i].Object.MapKey(), fmt.Errorf("map %s not open", g.name))
	}
}

func updateGroup[E Entry](ctx context.Context, name string, m Map, batch []reconciler.BatchEntry[E], idx []int) {
	// Entries of the wrong size fail here; the others go to the kernel
	// packed in two contiguous buffers.
	valid := idx[:0]
	for _, i := range idx {
		e := batch[i].Object
		if err := checkSizes(m, name, e.MapKey(), e.MapValue()); err != nil {
			batch[i].Result = err
			continue
		}
		valid = append(valid, i)
	}
	keys := newBatchBuf(int(m.KeySize()), len(valid))
	values := newBatchBuf(int(m.ValueSize()), len(valid))
	for j, i := range valid {
		keys.set(j, batch[i].Object.MapKey())
		values.set(j, batch[i].Object.MapValue())
	}

	batchAPI := true
	applyBatch(ctx, len(valid),
		func(from int) (int, error) {
			if batchAPI {
				n, err := m.BatchUpdate(keys.from(from), values.from(from), nil)
				if !errors.Is(err, ebpf.ErrNotSupported) {
					return n, err
				}
				batchAPI = false
			}
			if err := m.Put(keys.at(from), values.at(from)); err != nil {
				return 0, err
			}
			return 1, nil
		},
		func(j int, err error) {
			batch[valid[j]].Result = opError("update", name, keys.at(j), err)
		})
}

func deleteGroup[E Entry](ctx context.Context, name string, m Map, batch []reconciler.BatchEntry[E], idx []int) {
	valid := idx[:0]
	for _, i := range idx {
		if err := checkKeySize(m, name, batch[i].Object.MapKey()); err != nil {
			batch[i].Result = err
			continue
		}
		valid = append(valid, i)
	}
	keys := newBatchBuf(int(m.KeySize()), len(valid))
	for j, i := range valid {
		keys.set(j, batch[i].Object.MapKey())
	}
	deleteKeys(ctx, m, keys, func(j int, err error) {
		batch[valid[j]].Result = opError("delete", name, keys.at(j), err)
	})
}

// deleteKeys deletes every key of the buffer, in batches where the kernel
// has them. Keys already gone are success; fail is called for any other key
// the kernel refuses, and deletion goes on after it.
func deleteKeys(ctx context.Context, m Map, keys batchBuf, fail func(j int, err error)) {
	batchAPI := true
	applyBatch(ctx, keys.len(),
		func(from int) (int, error) {
			if batchAPI {
				n, err := m.BatchDelete(keys.from(from), nil)
				if !errors.Is(err, ebpf.ErrNotSupported) {
					return n, err
				}
				batchAPI = false
			}
			if err := m.Delete(keys.at(from)); err != nil {
				return 0, err
			}
			return 1, nil
		},
		func(j int, err error) {
			if !errors.Is(err, ebpf.ErrKeyNotExist) {
				fail(j, err)
			}
		})
}

// applyBatch drives a kernel batch operation over elements [0, n) that stops
// at the first element it cannot apply. op(from) works on elements from..n-1
// and returns how many it applied before an error. The element it stopped
// at gets the error through fail, and the operation resumes after it: every
// element is tried exactly once. Once ctx is done, the elements not yet tried
// fail with its error.
func applyBatch(ctx context.Context, n int, op func(from int) (int, error), fail func(j int, err error)) {
	for from := 0; from < n; {
		if err := ctx.Err(); err != nil {
			for j := from; j < n; j++ {
				fail(j, err)
			}
			return
		}
		applied, err := op(from)
		if applied <= 0 && err == nil {
			err = errors.New("kernel batch operation made no progress")
		}
		from += max(applied, 0)
		if err != nil {
			if from < n {
				fail(from, err)
			}
			from++
		}
	}
}
