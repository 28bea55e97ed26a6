// Package tablesync makes a statedb table equal to a desired set of rows by
// writing only the difference. A row that did not change keeps its revision,
// so the reconcilers and consumers downstream do no work for it: an edit that
// adds one CIDR writes one row, and one map operation or ip rule follows.
package tablesync

import "github.com/cilium/statedb"

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
	want := make(map[K]struct{}, len(desired))
	for _, o := range desired {
		want[key(o)] = struct{}{}
	}
	// Collect, then delete: the iterator is over the table being written.
	var stale []Obj
	for old := range table.All(wtxn) {
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
