package k8sclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"sync"
)

// queries matches the query of a URL in an error's text: it changes from
// one retry to the next (timeoutSeconds is random, resourceVersion moves).
var queries = regexp.MustCompile(`(https?://[^\s"?]*)\?[^\s"]*`)

// stableError is a list or watch error whose text leaves out what changes
// from one retry to the next (the request's query; "failed to list" when
// the reflector's handler reports the list's error), so that an outage is
// one error from its first retry to its last, logged once, as an
// unreadable file is. Unwrap keeps the error's kind for client-go
// (isWatchErrorRetriable, apierrors).
type stableError struct{ err error }

func (e stableError) Error() string {
	var ue *url.Error
	if errors.As(e.err, &ue) {
		return queries.ReplaceAllString(fmt.Sprintf("%s %q: %s", ue.Op, ue.URL, ue.Err), "$1")
	}
	return queries.ReplaceAllString(e.err.Error(), "$1")
}

func (e stableError) Unwrap() error { return e.err }

func stable(err error) error {
	if err == nil {
		return nil
	}
	return stableError{err}
}

// Logger is the logger to give client-go (klog.SetSlogLogger): log, with
// each distinct warning or error of client-go (its retries of a list or a
// watch) at its level once, and its repeats at DEBUG, until the API server
// answers again.
func Logger(log *slog.Logger) *slog.Logger {
	return slog.New(&onceHandler{inner: log.Handler(), seen: clientGoSeen})
}

// clientGoSeen is shared by every Logger: klog is one per process, and
// the probe clears it when the API server answers.
var clientGoSeen = &seenSet{keys: map[string]bool{}}

type seenSet struct {
	mu   sync.Mutex
	keys map[string]bool
}

// first reports whether key is new, and remembers it.
func (s *seenSet) first(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys[key] {
		return false
	}
	if len(s.keys) >= 1000 {
		clear(s.keys)
	}
	s.keys[key] = true
	return true
}

func (s *seenSet) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.keys)
}

type onceHandler struct {
	inner slog.Handler
	seen  *seenSet
	with  string // the attributes and groups of WithAttrs/WithGroup
}

func (h *onceHandler) Enabled(ctx context.Context, level slog.Level) bool {
	// A repeat goes out at DEBUG: let every warning through to Handle.
	return level >= slog.LevelWarn || h.inner.Enabled(ctx, level)
}

func (h *onceHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		var key strings.Builder
		key.WriteString(h.with + "|" + r.Level.String() + "|" + r.Message)
		r.Attrs(func(a slog.Attr) bool {
			key.WriteString("|" + a.String())
			return true
		})
		if !h.seen.first(queries.ReplaceAllString(key.String(), "$1")) {
			r.Level = slog.LevelDebug
		}
	}
	if !h.inner.Enabled(ctx, r.Level) {
		return nil
	}
	return h.inner.Handle(ctx, r)
}

func (h *onceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	with := h.with
	for _, a := range attrs {
		with += "|" + a.String()
	}
	return &onceHandler{inner: h.inner.WithAttrs(attrs), seen: h.seen, with: with}
}

func (h *onceHandler) WithGroup(name string) slog.Handler {
	return &onceHandler{inner: h.inner.WithGroup(name), seen: h.seen, with: h.with + "|group=" + name}
}
