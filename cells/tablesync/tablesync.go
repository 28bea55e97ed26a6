// Package tablesync makes a statedb table equal to a desired set of rows by
// writing only the difference. A row that did not change keeps its revision,
// so the reconcilers and consumers downstream do no work for it: an edit that
// adds one CIDR writes one row, and one map operation or ip rule follows.
package tablesync

import (
	"iter"

	"github.com/cilium/statedb"
)

// Rows says how the rows of a table are named, compared and written.
type Rows[Obj any, K comparable] struct {
	// Key names a row; Query looks a key up in the table's primary index.
	Key   func(Obj) K
	Query func(K) statedb.Query[Obj]
	// Same says whether an existing row already is the desired one.
	Same func(old, want Obj) bool
	// Insert returns the object to insert for a desired row (a clone with a
	// Pending reconciler status, say); nil inserts the row itself.
	Insert func(Obj) Obj
}

// Sync makes table hold exactly desired, within wtxn. It returns the number
// of rows inserted, replaced or deleted.
func (r Rows[Obj, K]) Sync(wtxn statedb.WriteTxn, table statedb.RWTable[Obj], desired []Obj) int {
	return r.SyncSubset(wtxn, table, table.All(wtxn), desired)
}

// SyncSubset is [Rows.Sync] for the part of a table that existing lists (an
// index query: the rows of one owner, of one pod): rows outside it are not
// touched. Every desired row must belong in it.
func (r Rows[Obj, K]) SyncSubset(wtxn statedb.WriteTxn, table statedb.RWTable[Obj], existing iter.Seq2[Obj, statedb.Revision], desired []Obj) int {
	want := make(map[K]struct{}, len(desired))
	for _, o := range desired {
		want[r.Key(o)] = struct{}{}
	}
	// Collect, then delete: the iterator is over the table being written.
	var stale []Obj
	for old := range existing {
		if _, ok := want[r.Key(old)]; !ok {
			stale = append(stale, old)
		}
	}
	for _, old := range stale {
		table.Delete(wtxn, old)
	}
	changed := len(stale)
	for _, o := range desired {
		if old, _, found := table.Get(wtxn, r.Query(r.Key(o))); found && r.Same(old, o) {
			continue
		}
		if r.Insert != nil {
			o = r.Insert(o)
		}
		table.Insert(wtxn, o)
		changed++
	}
	return changed
}

// SyncSorted is [Rows.Sync] for a table that holds exactly old, both old and
// desired sorted and distinct by order (order(a, b) == 0 when a and b have
// the same key): a merge of the two lists, no lookups in the table and no
// map of keys; only the rows that differ are written.
func (r Rows[Obj, K]) SyncSorted(wtxn statedb.WriteTxn, table statedb.RWTable[Obj], old, desired []Obj, order func(a, b Obj) int) int {
	changed := 0
	insert := func(o Obj) {
		if r.Insert != nil {
			o = r.Insert(o)
		}
		table.Insert(wtxn, o)
		changed++
	}
	i, j := 0, 0
	for i < len(old) || j < len(desired) {
		c := 0
		switch {
		case i == len(old):
			c = 1
		case j == len(desired):
			c = -1
		default:
			c = order(old[i], desired[j])
		}
		switch {
		case c < 0:
			table.Delete(wtxn, old[i])
			changed++
			i++
		case c > 0:
			insert(desired[j])
			j++
		default:
			if !r.Same(old[i], desired[j]) {
				insert(desired[j])
			}
			i++
			j++
		}
	}
	return changed
}
