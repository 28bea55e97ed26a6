package tablesync

import (
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

type row struct{ Name, Value string }

func (r *row) TableHeader() []string { return []string{"Name", "Value"} }
func (r *row) TableRow() []string    { return []string{r.Name, r.Value} }

var nameIndex = statedb.Index[*row, string]{
	Name:       "name",
	FromObject: func(r *row) index.KeySet { return index.NewKeySet(index.String(r.Name)) },
	FromKey:    index.String,
	Unique:     true,
}

func TestSyncWritesOnlyTheDifference(t *testing.T) {
	db := statedb.New()
	table, err := statedb.NewTable(db, "rows", nameIndex)
	if err != nil {
		t.Fatal(err)
	}
	sync := func(rows ...*row) int {
		wtxn := db.WriteTxn(table)
		defer wtxn.Commit()
		return Rows[*row, string]{
			Key:   func(r *row) string { return r.Name },
			Query: nameIndex.Query,
			Same:  func(old, want *row) bool { return *old == *want },
		}.Sync(wtxn, table, rows)
	}
	revision := func(name string) statedb.Revision {
		_, rev, ok := table.Get(db.ReadTxn(), nameIndex.Query(name))
		if !ok {
			return 0
		}
		return rev
	}

	if n := sync(&row{"a", "1"}, &row{"b", "1"}, &row{"c", "1"}); n != 3 {
		t.Fatalf("first sync wrote %d rows, want 3", n)
	}
	a, b := revision("a"), revision("b")

	// b changes, c goes, d comes, a stays as it is.
	if n := sync(&row{"a", "1"}, &row{"b", "2"}, &row{"d", "1"}); n != 3 {
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
	if n := sync(&row{"a", "1"}, &row{"b", "2"}, &row{"d", "1"}); n != 0 {
		t.Errorf("an identical sync wrote %d rows", n)
	}
}
