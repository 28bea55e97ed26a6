package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/nodeips"
	"github.com/enimasq/enimasq/cells/tablesync"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// table is one kind's table as the source writes it: from the directory
// (policySource, which reads the files for every kind at once) or from
// the API server (apiSource).
type table[R any, T row[R]] struct {
	*filesource.Source[T, string]
	kind *kind[R, T]
	dir  *policySource
	// index is the kind's place in the source's tables (and in the
	// errors of a file).
	index int
	// unknown names the fields of the kind's objects that enimasq does
	// not know (unknown.go), from files or the API.
	unknown *unknownFields
}

// kindTable is a table with its row type erased, for the source, which
// handles every kind at once.
type kindTable interface {
	setUp(s *policySource, index int, unknown *prometheus.CounterVec)
	logger() *slog.Logger
	// health is the kind's health: job's, or its scope below it.
	health(job cell.Health) cell.Health
	// of says whether a row is of the kind.
	of(r endpoints.Object) bool
	// resolve is the kind's resolve (recover.go) on rows of any kind.
	resolve(objs []parsedObject, last []endpoints.Object) []endpoints.Object
	initialized() bool
	// applyPartial, update and fail put a read of the directory into the
	// table.
	applyPartial(d dirRead)
	update(health cell.Health, d dirRead)
	fail(health cell.Health, err error, f filesource.Failure)
	// meta, registerInitializer and initDone are for the cell (register).
	meta() statedb.TableMeta
	registerInitializer(wtxn statedb.WriteTxn, name string)
	initDone(wtxn statedb.WriteTxn)
	// watchAPI makes the API server's objects of the kind the table's
	// (source_k8s.go).
	watchAPI(ctx context.Context, health cell.Health, client *k8sclient.Client, nodeIPs statedb.Table[*nodeips.NodeIP])
}

// newTable is the kind's table, made of what the cell gives it (base:
// log, database, table, metrics); the source sets up the rest.
func newTable[R any, T row[R]](k *kind[R, T], base filesource.Source[T, string]) *table[R, T] {
	return &table[R, T]{kind: k, Source: &filesource.Source[T, string]{
		Log: base.Log, DB: base.DB, Table: base.Table, InitDone: base.InitDone, Metrics: base.Metrics,
	}}
}

func (t *table[R, T]) setUp(s *policySource, index int, unknown *prometheus.CounterVec) {
	k := t.kind
	t.dir, t.index, t.unknown = s, index, newUnknownFields(k.name, unknown)
	t.Dir, t.Period = s.dir, s.period
	t.Failure = filesource.Always(filesource.Failure{Log: "Invalid " + k.plural() + ": their last good versions stay, or their pods are " + k.fate,
		Health: "invalid " + k.name + " files: their last good objects stay, or their pods are " + k.fate, Announce: true})
	t.Messages = filesource.Messages{
		Warning:    filesource.Line{Msg: k.name},
		Applied:    filesource.Line{Msg: "Applied " + k.plural()},
		ValidAgain: filesource.Line{Msg: k.name + " files are valid again", Attrs: []any{"dir", s.dir}},
	}
	t.Rows = tablesync.Rows[T, string]{
		Key:   func(o T) string { return o.Key() },
		Query: k.table.NameIndex.Query,
		Same:  func(old, o T) bool { return old == o || reflect.DeepEqual(old, o) },
	}
}

func (t *table[R, T]) logger() *slog.Logger { return t.Log }
func (t *table[R, T]) initialized() bool    { return t.Initialized() }
func (t *table[R, T]) meta() statedb.TableMeta {
	return t.Table
}

func (t *table[R, T]) health(job cell.Health) cell.Health {
	if t.kind.scope == "" {
		return job
	}
	return job.NewScope(t.kind.scope)
}

func (t *table[R, T]) of(r endpoints.Object) bool {
	_, ok := r.(T)
	return ok
}

func (t *table[R, T]) resolve(objs []parsedObject, last []endpoints.Object) []endpoints.Object {
	var lastOfKind []T
	for _, r := range last {
		if o, ok := r.(T); ok {
			lastOfKind = append(lastOfKind, o)
		}
	}
	var out []endpoints.Object
	for _, o := range t.kind.resolve(objs, lastOfKind) {
		out = append(out, o)
	}
	return out
}

func (t *table[R, T]) registerInitializer(wtxn statedb.WriteTxn, name string) {
	t.InitDone = t.Table.RegisterInitializer(wtxn, name)
}

func (t *table[R, T]) initDone(wtxn statedb.WriteTxn) { t.InitDone(wtxn) }

func (t *table[R, T]) applyPartial(d dirRead) { t.ApplyPartial(t.result(d).in) }

func (t *table[R, T]) update(health cell.Health, d dirRead) {
	if d.err != nil {
		t.Update(health, nil, d.err)
		return
	}
	r := t.result(d)
	t.Update(health, r.in, r.err)
}

func (t *table[R, T]) fail(health cell.Health, err error, f filesource.Failure) {
	t.Fail(health, err, f)
}

// readResult is what a read of the directory gives one table.
type readResult[T any] struct {
	in  *filesource.Input[T]
	err error
}

// result is the table's input from a read of the directory: the objects
// of the kind of every file in force, by key, an object defined in two
// files taken from the first by name, with a warning; and the errors of
// the files about objects of the kind.
func (t *table[R, T]) result(d dirRead) readResult[T] {
	desired, extra := map[string]T{}, map[string][]string{}
	var errs []error
	for _, name := range d.names {
		st := t.dir.files[name]
		if st == nil {
			continue
		}
		if i := t.index; i < len(st.errs) {
			errs = append(errs, st.errs[i])
		}
		f := st.current()
		if f == nil {
			continue
		}
		for _, r := range f.rows {
			o, ok := r.(T)
			if !ok {
				continue
			}
			if _, dup := desired[o.Key()]; dup {
				extra[o.Key()] = append(extra[o.Key()], fmt.Sprintf("also defined in %s: that copy is ignored", *o.Common().File))
				continue
			}
			desired[o.Key()] = o
		}
	}
	in := t.input(desired, extra)
	slices.Sort(in.Warnings)
	in.Summary = fmt.Sprintf("%d %s from %d files in %s", len(in.Rows), t.kind.plural(), d.files, t.dir.dir)
	in.Incomplete = d.incomplete
	return readResult[T]{in: in, err: joinErrors(errors.Join(errs...))}
}

// input is the rows of desired, sorted by key, each as this node programs
// it (kind.forNode) with extra added (to a copy: the object may be a last
// good version), and all their warnings, each prefixed with its key;
// their unknown fields are named (unknown.go).
func (t *table[R, T]) input(desired map[string]T, extra map[string][]string) *filesource.Input[T] {
	in := &filesource.Input[T]{}
	unknown := map[string][]string{}
	for _, key := range slices.Sorted(maps.Keys(desired)) {
		o := t.kind.forNode(desired[key], t.dir.node)
		unknown[key] = *o.Common().Unknown
		if more := extra[key]; len(more) > 0 {
			o = withWarnings(o, more...)
		}
		for _, w := range *o.Common().Warnings {
			in.Warnings = append(in.Warnings, key+": "+w)
		}
		in.Rows = append(in.Rows, o)
	}
	in.Note = t.unknown.note(t.Log, unknown)
	return in
}

func familyDisabled(a interface{ Is4() bool }) string {
	if a.Is4() {
		return "IPv4 is disabled on this node (--enable-ipv4=false)"
	}
	return "IPv6 is disabled on this node (--enable-ipv6=false)"
}
