package metrics

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type row struct {
	id     int
	status reconciler.Status
}

func (r *row) TableHeader() []string { return []string{"ID", "Status"} }
func (r *row) TableRow() []string    { return []string{fmt.Sprint(r.id), r.status.Kind.String()} }

var rowIndex = statedb.Index[*row, int]{
	Name:       "id",
	FromObject: func(r *row) index.KeySet { return index.NewKeySet(index.Int(r.id)) },
	FromKey:    index.Int,
	Unique:     true,
}

func newRows(t testing.TB, n int, statusOf func(i int) reconciler.Status) (*statedb.DB, statedb.RWTable[*row]) {
	db := statedb.New()
	tbl, err := statedb.NewTable(db, "rows", rowIndex)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(tbl)
	for i := range n {
		tbl.Insert(wtxn, &row{id: i, status: statusOf(i)})
	}
	wtxn.Commit()
	return db, tbl
}

// Rows are counted by status; rows the status function skips are not.
func TestTableRows(t *testing.T) {
	db, tbl := newRows(t, 6, func(i int) reconciler.Status {
		switch i % 3 {
		case 0:
			return reconciler.StatusDone()
		case 1:
			return reconciler.StatusError(fmt.Errorf("refused"))
		}
		return reconciler.StatusPending()
	})
	c := TableRows(db, tbl, func(r *row) (reconciler.Status, bool) { return r.status, r.id != 5 })
	want := `
# HELP enimasq_reconcile_rows Rows of a desired-state table by reconcile status (pending, done, error)
# TYPE enimasq_reconcile_rows gauge
enimasq_reconcile_rows{status="done",table="rows"} 2
enimasq_reconcile_rows{status="error",table="rows"} 2
enimasq_reconcile_rows{status="pending",table="rows"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// A source's errors count, and its last success is set only by a success.
func TestSource(t *testing.T) {
	s := NewSource("file")
	s.Error()
	s.Error()
	if got := testutil.ToFloat64(s.errors); got != 2 {
		t.Errorf("errors %g, want 2", got)
	}
	if got := testutil.ToFloat64(s.lastSuccess); got != 0 {
		t.Errorf("last success %g before any success", got)
	}
	s.Success()
	if got := testutil.ToFloat64(s.lastSuccess); got == 0 {
		t.Errorf("no last success after one")
	}
	var nilSource *Source
	nilSource.Error() // a cell without metrics passes nil
	nilSource.Success()
}

// BenchmarkTableRowsScrape: a scrape of the rows of a 16384-row table by
// status, against the floor of iterating the same table.
func BenchmarkTableRowsScrape(b *testing.B) {
	db, tbl := newRows(b, 16384, func(int) reconciler.Status { return reconciler.StatusDone() })
	b.Run("floor-iterate", func(b *testing.B) {
		for b.Loop() {
			n := 0
			for r := range tbl.All(db.ReadTxn()) {
				if r.status.Kind == reconciler.StatusKindDone {
					n++
				}
			}
		}
	})
	b.Run("scrape", func(b *testing.B) {
		reg := prometheus.NewRegistry()
		reg.MustRegister(TableRows(db, tbl, func(r *row) (reconciler.Status, bool) { return r.status, true }))
		for b.Loop() {
			if _, err := reg.Gather(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
