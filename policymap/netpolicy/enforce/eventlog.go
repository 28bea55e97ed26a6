package enforce

import (
	"container/list"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// The log of denied packets is limited per pod and reason: a flood of
// denials (a pod hammering a denied peer) would write a line a packet
// (2.56 M denied frames in 12 s wrote 1.33 M lines, 337 MiB). Each (pod,
// reason) has a token bucket of eventLogBurst lines, refilled at
// eventLogRate a second; a packet past it is not logged but counted, and
// a summary line says how many were not ("N more denied packets of pod X,
// reason Y, not logged in the last T") at the next flush (every
// eventLogFlush, and when the reader stops), or when the key is evicted
// (at most eventLogKeys keys, least recently seen first). Every event is still
// read, kept, served and counted: only the log line is limited.
const (
	eventLogRate  = 2.0 // lines a second per pod and reason
	eventLogBurst = 5
	eventLogKeys  = 4096
	eventLogFlush = 5 * time.Second
)

type eventLogKey struct {
	pod    netip.Addr
	reason policybpf.PolicyReason
	// audited: passed by audit mode (its lines say "would deny").
	audited bool
}

type eventLogBucket struct {
	key        eventLogKey
	tokens     float64
	last       time.Time // of the last refill
	suppressed uint64
	since      time.Time // of the first packet not logged
}

// eventLogLimiter is the token buckets, by (pod, reason), in LRU order.
type eventLogLimiter struct {
	rate  float64
	burst float64
	max   int

	mu      sync.Mutex
	buckets map[eventLogKey]*list.Element
	lru     list.List // front: most recently seen
}

func newEventLogLimiter(rate float64, burst, max int) *eventLogLimiter {
	return &eventLogLimiter{rate: rate, burst: float64(burst), max: max, buckets: map[eventLogKey]*list.Element{}}
}

// suppressedLine is a summary of the packets of a key not logged.
type suppressedLine struct {
	key   eventLogKey
	n     uint64
	since time.Time
}

// allow says whether a packet of key is logged at now, and returns the
// summary to log first of a key evicted to make room.
func (l *eventLogLimiter) allow(key eventLogKey, now time.Time) (bool, []suppressedLine) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []suppressedLine
	el := l.buckets[key]
	if el == nil {
		if l.lru.Len() >= l.max {
			old := l.lru.Back()
			b := old.Value.(*eventLogBucket)
			if b.suppressed > 0 {
				out = append(out, suppressedLine{b.key, b.suppressed, b.since})
			}
			l.lru.Remove(old)
			delete(l.buckets, b.key)
		}
		el = l.lru.PushFront(&eventLogBucket{key: key, tokens: l.burst, last: now})
		l.buckets[key] = el
	} else {
		l.lru.MoveToFront(el)
	}
	b := el.Value.(*eventLogBucket)
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(l.burst, b.tokens+d.Seconds()*l.rate)
		b.last = now
	}
	if b.tokens < 1 {
		if b.suppressed == 0 {
			b.since = now
		}
		b.suppressed++
		return false, out
	}
	b.tokens--
	return true, out
}

// flush returns the summaries of every key with packets not logged.
func (l *eventLogLimiter) flush() []suppressedLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []suppressedLine
	for el := l.lru.Back(); el != nil; el = el.Prev() {
		b := el.Value.(*eventLogBucket)
		if b.suppressed > 0 {
			out = append(out, suppressedLine{b.key, b.suppressed, b.since})
			b.suppressed = 0
		}
	}
	return out
}

// logSuppressed writes the summary lines.
func logSuppressed(log *slog.Logger, lines []suppressedLine, now time.Time) {
	for _, s := range lines {
		d := now.Sub(s.since).Round(time.Millisecond)
		what := "denied"
		if s.key.audited {
			what = "audited (would deny)"
		}
		log.Info(fmt.Sprintf("%d more %s packets of pod %s, reason %q, not logged in the last %s (at most %g lines a second, %d at once, per pod and reason)",
			s.n, what, podText(s.key.pod), s.key.reason.String(), d, eventLogRate, eventLogBurst),
			"pod", podText(s.key.pod), "reason", s.key.reason.String(), "suppressed", s.n, "interval", d)
	}
}

func podText(a netip.Addr) string {
	if !a.IsValid() {
		return "(not IP)"
	}
	return a.String()
}
