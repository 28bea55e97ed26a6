package filesource

import (
	"context"
	"log/slog"
	"slices"

	"github.com/cilium/hive/cell"
)

// Line is a log message and its leading attributes.
type Line struct {
	Msg   string
	Attrs []any
}

func (l Line) log(log *slog.Logger, level slog.Level, attrs ...any) {
	log.Log(context.Background(), level, l.Msg, slices.Concat(l.Attrs, attrs)...)
}

// Messages are what a source logs when a read is good.
type Messages struct {
	Warning Line // each warning, at Warn, with "warning"
	Applied Line // at Info, with "summary" and "rows-changed"
	// ValidAgain is logged at Info on the first good read after a failure
	// whose Failure.Announce was set.
	ValidAgain Line
}

// Failure says how a failed read is reported. It differs by source and by
// state: a missing input may be "not yet" before the first good read and
// "gone, keeping the last state" after it.
type Failure struct {
	// Log is logged once per distinct Log and error: at Error, or at Info
	// when Waiting. Its attributes are Attrs, or "error" and the error when
	// Attrs is nil.
	Log   string
	Attrs []any
	// Health is the Degraded reason, given with the error; with Waiting it
	// is the text of health OK.
	Health string
	// Waiting: nothing is wrong yet (the input does not exist before the
	// first good read).
	Waiting bool
	// Uncounted: not counted in source_errors_total.
	Uncounted bool
	// Announce: once the input is good again, Messages.ValidAgain is
	// logged.
	Announce bool
}

// Always is the Failure func of a source that reports every error as f.
func Always(f Failure) func(error) Failure {
	return func(error) Failure { return f }
}

// Fail reports a failed read as f says; the table stays as it is.
func (s *Source[Obj, K]) Fail(health cell.Health, err error, f Failure) {
	if !f.Uncounted {
		s.Metrics.Error()
	}
	key := f.Log
	if err != nil {
		key += ": " + err.Error()
	}
	if key != s.lastErr {
		s.lastErr, s.announce = key, f.Announce
		level, attrs := slog.LevelError, f.Attrs
		if f.Waiting {
			level = slog.LevelInfo
		}
		if attrs == nil {
			attrs = []any{"error", err}
		}
		Line{f.Log, attrs}.log(s.Log, level)
	}
	if f.Waiting {
		health.OK(f.Health)
		return
	}
	// The message names the file, field and value itself: an embedding
	// agent's health view may show the message alone (Cilium's
	// `cilium-dbg status --all-health` tree does).
	msg := f.Health
	if err != nil {
		msg += ": " + err.Error()
	}
	health.Degraded(msg, err)
}
