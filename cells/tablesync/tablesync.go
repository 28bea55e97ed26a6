// Package tablesync makes a statedb table equal to a desired set of rows by
// writing only the difference. A row that did not change keeps its revision,
// so the reconcilers and consumers downstream do no work for it: an edit that
// adds one CIDR writes one row, and one map operation or ip rule follows.
package tablesync

import (
	"iter"

	"github.com/cilium/statedb"
)

// Sync makes table hold exactly desired, within wtxn. key names a row and
// query looks a key up in the table's primary index; same says whether an
// existing row already is the desired one; insert returns the object to
// insert for a desired row (the row itself, or a clone with a Pending
// reconciler status). It returns the number of rows inserted, replaced or
// deleted.
func Sync[Obj any, K comparable](
	wtxn statedb.WriteTxn,
	table statedb.RWTable[Obj],
	desired []Obj,
	key func(Obj) K,
	query func(K) statedb.Query[Obj],
	same func(old, want Obj) bool,
	insert func(Obj) Obj,
) int {
	return SyncSubset(wtxn, table, table.All(wtxn), desired, key, query, same, insert)
}

// SyncSubset is [Sync] for the part of a table that existing lists (an index
// query: the rows of one owner, of one pod): rows outside it are not
// touched. Every desired row must belong in it.
func SyncSubset[Obj any, K comparable](
	wtxn statedb.WriteTxn,
	table statedb.RWTable[Obj],
	existing iter.Seq2[Obj, statedb.Revision],
	desired []Obj,
	key func(Obj) K,
	query func(K) statedb.Query[Obj],
	same func(old, want Obj) bool,
	insert func(Obj) Obj,
) int {
	want := make(map[K]struct{}, len(desired))
	for _, o := range desired {
		want[key(o)] = struct{}{}
	}
	// Collect, then delete: the iterator is over the table being written.
	var stale []Obj
	for old := range existing {
		if _, ok := want[key(old)]; !ok {
			stale = append(stale, old)
		}
	}
	for _, old := range stale {
		table.Delete(wtxn, old)
	}
	changed := len(stale)
	for _, o := range desired {
		if old, _, found := table.Get(wtxn, query(key(o))); found && same(old, o) {
			continue
		}
		table.Insert(wtxn, insert(o))
		changed++
	}
	return changed
}
