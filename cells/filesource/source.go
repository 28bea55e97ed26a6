package filesource

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/filewatch"
	"github.com/enimasq/enimasq/cells/metrics"
	"github.com/enimasq/enimasq/cells/tablesync"
)

// Input is what one good read gives: the desired rows of the table.
type Input[Obj any] struct {
	Rows     []Obj
	Warnings []string // logged once per distinct set
	Summary  string   // the health OK text; logged when it changes
	// Note is added to the health OK text, not logged: what the source
	// logs itself (once, not at every change of the summary).
	Note string
	// Incomplete: a part of the input never was good (its rows before a
	// restart are unknown): the rows apply, the table is not initialized.
	Incomplete bool
}

// Source keeps Table equal to an input. Run watches a file or directory and
// reads it with Read; an API source feeds Update and Fail itself.
type Source[Obj any, K comparable] struct {
	// Dir is the directory watched (the file's, or the directory of files);
	// Period is the re-read period, asked again after every read.
	Dir    string
	Period func() time.Duration
	// Settle, when positive, is how long a file written in place must be
	// stable before it is read (filewatch.Options.Settle): its half-written
	// states are never read. Renames and ConfigMap swaps are read at once.
	Settle time.Duration
	// File, when set, is the name in Dir of the one file read: while
	// filewatch holds it (written in place and not yet settled, or just
	// deleted or renamed away), a read leaves the table as it is; other
	// names of Dir (an editor's swap file, a temporary file) never delay
	// it.
	File string
	// Read reads and parses the input. It returns nil and the error when
	// nothing can apply, the input and an error when only a part of it is
	// bad (that part's last good rows are in the input). It may return the
	// very Input it returned last time to say that the input did not
	// change: the table is then not diffed again, unless something else
	// wrote it since.
	Read func() (*Input[Obj], error)
	// Failure says how an error of Read (or one given to Update) is
	// reported.
	Failure func(error) Failure
	Messages

	Log      *slog.Logger
	DB       *statedb.DB
	Table    statedb.RWTable[Obj]
	Rows     tablesync.Rows[Obj, K]
	InitDone func(statedb.WriteTxn) // the table's initializer; nil once called
	Metrics  *metrics.Source
	// Order, when set, orders the rows of every Input, which come sorted
	// and distinct by it (Order(a, b) == 0 when a and b have the same
	// Key). An input is then diffed against the last one applied, as
	// long as the table is as that left it, by a merge of the two sorted
	// lists: no lookups in the table, no map of keys; only the rows that
	// differ are written, as with Rows.Sync.
	Order func(a, b Obj) int

	lastErr      string // the key of the last failure logged; "" while good
	announce     bool   // log ValidAgain when the input is good again
	lastWarnings string
	lastSummary  string
	lastIn       *Input[Obj]      // the input last applied,
	lastRev      statedb.Revision // and the table's revision after it
}

// Run reads the input at start, after every change in Dir (or in its
// nearest existing ancestor while Dir is missing) and every Period, until
// ctx is done.
func (s *Source[Obj, K]) Run(ctx context.Context, health cell.Health) error {
	return filewatch.Watch(ctx, s.Log, filewatch.Options{Dir: s.Dir, Period: s.Period, Settle: s.Settle}, func(r *filewatch.Read) {
		if s.File != "" && r.Held(s.File) {
			return // read when it settles
		}
		in, err := s.Read()
		s.Update(health, in, err)
	})
}

// Initialized says whether a good read has initialized the table.
func (s *Source[Obj, K]) Initialized() bool { return s.InitDone == nil }

// Update puts in into the table and reports health: OK with in's summary,
// or, with err, the failure (and, without in, the table stays as it is).
func (s *Source[Obj, K]) Update(health cell.Health, in *Input[Obj], err error) {
	if in != nil {
		s.apply(in, err == nil)
	}
	if err != nil {
		s.Fail(health, err, s.Failure(err))
		return
	}
	s.Metrics.Success()
	health.OK(in.Summary + in.Note)
}

// apply writes the difference between the table and in (unchanged rows
// keep their revision), initializes the table the first time in is
// complete, and logs what is new: the input good again, the warnings, the
// rows changed or the summary.
func (s *Source[Obj, K]) apply(in *Input[Obj], good bool) {
	if good && s.lastErr != "" {
		if s.announce {
			s.ValidAgain.log(s.Log, slog.LevelInfo)
		}
		s.lastErr = ""
	}
	if w := strings.Join(in.Warnings, "\n"); w != s.lastWarnings {
		s.lastWarnings = w
		for _, warning := range in.Warnings {
			s.Warning.log(s.Log, slog.LevelWarn, "warning", warning)
		}
	}
	s.write(in)
}

// ApplyPartial puts in, a part of a read still going on (the files of a
// directory parsed so far, the others at their last state), into the
// table, without initializing it, reporting health or logging warnings:
// the read's Update does, when it is whole.
func (s *Source[Obj, K]) ApplyPartial(in *Input[Obj]) {
	c := *in
	c.Incomplete = true
	s.write(&c)
}

// write writes the difference between the table and in, initializes the
// table the first time in is complete, and logs the rows changed or the
// summary.
func (s *Source[Obj, K]) write(in *Input[Obj]) {
	if in == s.lastIn && (s.InitDone == nil || in.Incomplete) && s.Table.Revision(s.DB.ReadTxn()) == s.lastRev {
		return // the same input, and the table as it left it
	}
	wtxn := s.DB.WriteTxn(s.Table)
	var changed int
	if s.Order != nil && s.lastIn != nil && s.Table.Revision(wtxn) == s.lastRev {
		changed = s.Rows.SyncSorted(wtxn, s.Table, s.lastIn.Rows, in.Rows, s.Order)
	} else {
		changed = s.Rows.Sync(wtxn, s.Table, in.Rows)
	}
	if s.InitDone != nil && !in.Incomplete {
		s.InitDone(wtxn)
		s.InitDone = nil
	}
	wtxn.Commit()
	s.lastIn, s.lastRev = in, s.Table.Revision(s.DB.ReadTxn())
	if changed > 0 || in.Summary != s.lastSummary {
		s.Applied.log(s.Log, slog.LevelInfo, "summary", in.Summary, "rows-changed", changed)
		s.lastSummary = in.Summary
	}
}
