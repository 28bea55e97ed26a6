package policymap

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"
)

type testRow struct {
	ID     int
	Status reconciler.Status
}

func (r *testRow) TableHeader() []string { return []string{"ID", "Status"} }
func (r *testRow) TableRow() []string {
	return []string{strconv.Itoa(r.ID), r.Status.Kind.String()}
}

var testRowIndex = statedb.Index[*testRow, int]{
	Name:       "id",
	FromObject: func(r *testRow) index.KeySet { return index.NewKeySet(index.Int(r.ID)) },
	FromKey:    index.Int,
	Unique:     true,
}

// TestRefreshMarksDueRowsInBatches: a pass marks every Done row older than
// the interval Refreshing, a thousand rows to a write transaction, leaves the rows in other states and the younger rows
// alone, and says when the oldest younger row is due.
func TestRefreshMarksDueRowsInBatches(t *testing.T) {
	db := statedb.New()
	table, err := statedb.NewTable(db, "rows", testRowIndex)
	if err != nil {
		t.Fatal(err)
	}
	const interval = time.Hour
	old := time.Now().Add(-2 * interval)
	young := time.Now().Add(-interval / 2)
	wtxn := db.WriteTxn(table)
	for i := range 2500 {
		table.Insert(wtxn, &testRow{ID: i, Status: reconciler.Status{Kind: reconciler.StatusKindDone, UpdatedAt: old}})
	}
	table.Insert(wtxn, &testRow{ID: 2500, Status: reconciler.Status{Kind: reconciler.StatusKindError, UpdatedAt: old}})
	wtxn.Commit()
	wtxn = db.WriteTxn(table) // later revisions: after the old rows
	table.Insert(wtxn, &testRow{ID: 2501, Status: reconciler.Status{Kind: reconciler.StatusKindDone, UpdatedAt: young}})
	wtxn.Commit()

	r := &refresher[*testRow]{db: db, table: table, interval: interval, limiter: rate.NewLimiter(rate.Inf, refreshBatch),
		clone:     func(r *testRow) *testRow { c := *r; return &c },
		setStatus: func(r *testRow, s reconciler.Status) *testRow { r.Status = s; return r },
		getStatus: func(r *testRow) reconciler.Status { return r.Status }}
	_, wait, err := r.pass(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}

	for row := range table.All(db.ReadTxn()) {
		want := reconciler.StatusKindRefreshing
		switch row.ID {
		case 2500:
			want = reconciler.StatusKindError
		case 2501:
			want = reconciler.StatusKindDone
		}
		if row.Status.Kind != want {
			t.Fatalf("row %d: %s, want %s", row.ID, row.Status.Kind, want)
		}
	}
	if r.commits != 3 {
		t.Errorf("2500 rows marked in %d write transactions, want 3", r.commits)
	}
	if due := interval / 2; wait > due || wait < due-time.Minute {
		t.Errorf("next pass in %s, want about %s (when row 2501 is due)", wait, due)
	}
}
