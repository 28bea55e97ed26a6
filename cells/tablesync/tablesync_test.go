package tablesync

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
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

// SyncSorted leaves the table as Sync does (the oracle), for random old and
// desired lists, and writes as many rows.
func TestSyncSortedIsSync(t *testing.T) {
	rows := Rows[*celltest.Row, string]{
		Key:   func(r *celltest.Row) string { return r.Name },
		Query: celltest.RowNameIndex.Query,
		Same:  func(old, want *celltest.Row) bool { return *old == *want },
	}
	order := func(a, b *celltest.Row) int { return strings.Compare(a.Name, b.Name) }
	rng := rand.New(rand.NewPCG(1, 2))
	random := func() []*celltest.Row {
		var out []*celltest.Row
		for i := range 12 {
			if rng.IntN(2) == 0 {
				out = append(out, &celltest.Row{Name: fmt.Sprintf("r%02d", i), Value: fmt.Sprint(rng.IntN(2))})
			}
		}
		return out
	}
	dump := func(db *statedb.DB, table statedb.Table[*celltest.Row]) []celltest.Row {
		var out []celltest.Row
		for r := range table.All(db.ReadTxn()) {
			out = append(out, *r)
		}
		return out
	}
	for round := range 200 {
		old, desired := random(), random()
		var got [2][]celltest.Row
		var written [2]int
		for k := range 2 {
			db := statedb.New()
			table, err := statedb.NewTable(db, "rows", celltest.RowNameIndex)
			if err != nil {
				t.Fatal(err)
			}
			wtxn := db.WriteTxn(table)
			rows.Sync(wtxn, table, old)
			if k == 0 {
				written[k] = rows.Sync(wtxn, table, desired)
			} else {
				written[k] = rows.SyncSorted(wtxn, table, old, desired, order)
			}
			wtxn.Commit()
			got[k] = dump(db, table)
		}
		if !slices.Equal(got[0], got[1]) || written[0] != written[1] {
			t.Fatalf("round %d: old %v desired %v: Sync %v (%d written), SyncSorted %v (%d written)",
				round, old, desired, got[0], written[0], got[1], written[1])
		}
	}
}
