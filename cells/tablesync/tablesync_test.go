package tablesync

import (
	"testing"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/celltest"
)

func TestSyncWritesOnlyTheDifference(t *testing.T) {
	db := statedb.New()
	table, err := statedb.NewTable(db, "rows", celltest.RowNameIndex)
	if err != nil {
		t.Fatal(err)
	}
	row := func(name, value string) *celltest.Row { return &celltest.Row{Name: name, Value: value} }
	sync := func(rows ...*celltest.Row) int {
		wtxn := db.WriteTxn(table)
		defer wtxn.Commit()
		return Rows[*celltest.Row, string]{
			Key:   func(r *celltest.Row) string { return r.Name },
			Query: celltest.RowNameIndex.Query,
			Same:  func(old, want *celltest.Row) bool { return *old == *want },
		}.Sync(wtxn, table, rows)
	}
	revision := func(name string) statedb.Revision {
		_, rev, ok := table.Get(db.ReadTxn(), celltest.RowNameIndex.Query(name))
		if !ok {
			return 0
		}
		return rev
	}

	if n := sync(row("a", "1"), row("b", "1"), row("c", "1")); n != 3 {
		t.Fatalf("first sync wrote %d rows, want 3", n)
	}
	a, b := revision("a"), revision("b")

	// b changes, c goes, d comes, a stays as it is.
	if n := sync(row("a", "1"), row("b", "2"), row("d", "1")); n != 3 {
		t.Errorf("second sync wrote %d rows, want 3 (b, c, d)", n)
	}
	if revision("a") != a {
		t.Errorf("unchanged row a was rewritten")
	}
	if revision("b") == b {
		t.Errorf("changed row b kept its revision")
	}
	if revision("c") != 0 || revision("d") == 0 {
		t.Errorf("c should be gone and d present")
	}
	if n := sync(row("a", "1"), row("b", "2"), row("d", "1")); n != 0 {
		t.Errorf("an identical sync wrote %d rows", n)
	}
}
