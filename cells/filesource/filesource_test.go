package filesource_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/tablesync"
)

// fixture is a Source on a fresh table whose log goes to a buffer.
type fixture struct {
	*filesource.Source[*celltest.Row, string]
	log    *bytes.Buffer
	health *celltest.Health
}

func newFixture(t *testing.T) *fixture {
	db := statedb.New()
	table, err := statedb.NewTable(db, "rows", celltest.RowNameIndex)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(table)
	initDone := table.RegisterInitializer(wtxn, "test")
	wtxn.Commit()
	f := &fixture{log: &bytes.Buffer{}, health: &celltest.Health{}}
	f.Source = &filesource.Source[*celltest.Row, string]{
		Failure: func(err error) filesource.Failure {
			if !f.Initialized() {
				return filesource.Failure{Log: "not yet", Health: "waiting", Waiting: true}
			}
			return filesource.Failure{Log: "invalid", Health: "keeping the last rows", Announce: true}
		},
		Messages: filesource.Messages{
			Warning:    filesource.Line{Msg: "warning"},
			Applied:    filesource.Line{Msg: "applied"},
			ValidAgain: filesource.Line{Msg: "valid again"},
		},
		Log: slog.New(slog.NewTextHandler(f.log, nil)), DB: db, Table: table, InitDone: initDone,
		Rows: tablesync.Rows[*celltest.Row, string]{
			Key:   func(r *celltest.Row) string { return r.Name },
			Query: celltest.RowNameIndex.Query,
			Same:  func(old, want *celltest.Row) bool { return *old == *want },
		},
	}
	return f
}

// rows is the table as "name=value ...", and whether it is initialized.
func (f *fixture) rows() (string, bool) {
	txn := f.DB.ReadTxn()
	var out []string
	for r := range f.Table.All(txn) {
		out = append(out, r.Name+"="+r.Value)
	}
	ok, _ := f.Table.Initialized(txn)
	return strings.Join(out, " "), ok
}

// logged returns the messages logged since the last call.
func (f *fixture) logged() string {
	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(f.log.String()), "\n") {
		if _, msg, ok := strings.Cut(line, "msg="); ok {
			msgs = append(msgs, strings.Fields(strings.Trim(msg, `"`))[0])
		}
	}
	f.log.Reset()
	return strings.Join(msgs, ",")
}

func (f *fixture) check(t *testing.T, step, rows string, initialized bool, health, logged string) {
	t.Helper()
	gotRows, gotInit := f.rows()
	if gotRows != rows || gotInit != initialized || f.health.Get() != health {
		t.Errorf("%s: rows %q initialized %t health %q, want %q %t %q", step, gotRows, gotInit, f.health.Get(), rows, initialized, health)
	}
	if got := f.logged(); got != logged {
		t.Errorf("%s: logged %q, want %q", step, got, logged)
	}
}

func input(warnings []string, rows ...string) *filesource.Input[*celltest.Row] {
	in := &filesource.Input[*celltest.Row]{Warnings: warnings, Summary: fmt.Sprintf("%d rows", len(rows))}
	for _, r := range rows {
		name, value, _ := strings.Cut(r, "=")
		in.Rows = append(in.Rows, &celltest.Row{Name: name, Value: value})
	}
	return in
}

// TestSourceStates: waiting, then good, then bad (logged once, the last
// rows kept), then good again; warnings logged once per distinct set.
func TestSourceStates(t *testing.T) {
	f := newFixture(t)
	missing := errors.New("missing")
	f.Update(f.health, nil, missing)
	f.Update(f.health, nil, missing)
	f.check(t, "missing", "", false, "OK: waiting", "not")

	f.Update(f.health, input([]string{"w"}, "a=1", "b=1"), nil)
	f.Update(f.health, input([]string{"w"}, "a=1", "b=1"), nil)
	f.check(t, "good", "a=1 b=1", true, "OK: 2 rows", "warning,applied")

	bad := errors.New("bad")
	f.Update(f.health, nil, bad)
	f.Update(f.health, nil, bad)
	f.check(t, "bad", "a=1 b=1", true, "Degraded: keeping the last rows: bad", "invalid")

	f.Update(f.health, input(nil, "a=2"), nil)
	f.check(t, "good again", "a=2", true, "OK: 1 rows", "valid,applied")
}

// TestSourceIncomplete: a partial input applies but does not initialize
// the table, and its error is reported.
func TestSourceIncomplete(t *testing.T) {
	f := newFixture(t)
	in := input(nil, "a=1")
	in.Incomplete = true
	f.Update(f.health, in, errors.New("part bad"))
	f.check(t, "incomplete", "a=1", false, "OK: waiting", "applied,not")

	f.Update(f.health, input(nil, "a=1", "b=1"), nil)
	f.check(t, "complete", "a=1 b=1", true, "OK: 2 rows", "applied")
}

// TestParts: a part that goes bad keeps its last good version; one that
// never was good makes the input incomplete; unnamed parts are forgotten.
func TestParts(t *testing.T) {
	var p filesource.Parts[string]
	read := func(content map[string]string) func(string, string) (string, error) {
		return func(name, last string) (string, error) {
			if c := content[name]; c != "bad" {
				return c, nil
			}
			return "", fmt.Errorf("%s: bad", name)
		}
	}
	good, complete, err := p.Read([]string{"a", "b"}, read(map[string]string{"a": "1", "b": "bad"}))
	if fmt.Sprint(good) != "map[a:1]" || complete || err == nil {
		t.Fatalf("first read: %v %t %v", good, complete, err)
	}
	good, complete, err = p.Read([]string{"a", "b"}, read(map[string]string{"a": "bad", "b": "2"}))
	if fmt.Sprint(good) != "map[a:1 b:2]" || !complete || err == nil {
		t.Fatalf("second read: %v %t %v", good, complete, err)
	}
	good, complete, err = p.Read([]string{"b"}, read(map[string]string{"b": "3"}))
	if fmt.Sprint(good) != "map[b:3]" || !complete || err != nil {
		t.Fatalf("third read: %v %t %v", good, complete, err)
	}
}

// TestSourceOrder: with Order, an input is diffed against the last one by a
// merge; the rows written are the same as by Rows.Sync, and a write by
// someone else makes the next input diff against the table again.
func TestSourceOrder(t *testing.T) {
	f := newFixture(t)
	f.Order = func(a, b *celltest.Row) int { return strings.Compare(a.Name, b.Name) }
	f.Update(f.health, input(nil, "a=1", "b=1", "c=1"), nil)
	f.check(t, "first", "a=1 b=1 c=1", true, "OK: 3 rows", "applied")
	rev := func(name string) statedb.Revision {
		_, r, _ := f.Table.Get(f.DB.ReadTxn(), celltest.RowNameIndex.Query(name))
		return r
	}
	a, c := rev("a"), rev("c")
	f.Update(f.health, input(nil, "a=1", "c=2", "d=1"), nil)
	f.check(t, "merged", "a=1 c=2 d=1", true, "OK: 3 rows", "applied")
	if rev("a") != a || rev("c") == c {
		t.Errorf("a rewritten or c not: revisions %d->%d, %d->%d", a, rev("a"), c, rev("c"))
	}
	// Someone else writes the table: the next diff is against the table.
	wtxn := f.DB.WriteTxn(f.Table)
	f.Table.Insert(wtxn, &celltest.Row{Name: "x", Value: "1"})
	wtxn.Commit()
	f.Update(f.health, input(nil, "a=1", "c=2", "d=1"), nil)
	f.check(t, "after a foreign write", "a=1 c=2 d=1", true, "OK: 3 rows", "applied")
}
