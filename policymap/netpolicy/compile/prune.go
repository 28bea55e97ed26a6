package compile

import (
	"sync"
	"time"
)

// pruneAfter is how long a prune request waits for others: the pods of a
// restart switch from their restored versions in parts, and each prune
// walks the kind's maps whole.
const pruneAfter = 200 * time.Millisecond

// pruneTrigger asks for a prune (the reconciler's Prune) once for the
// requests of a period: at most one prune per period, the first request
// served within it.
type pruneTrigger struct {
	after time.Duration
	prune func()

	mu      sync.Mutex
	pending bool
}

func newPruneTrigger(after time.Duration, prune func()) *pruneTrigger {
	return &pruneTrigger{after: after, prune: prune}
}

// request asks for a prune within the period.
func (p *pruneTrigger) request() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending {
		return
	}
	p.pending = true
	time.AfterFunc(p.after, func() {
		p.mu.Lock()
		p.pending = false
		p.mu.Unlock()
		p.prune()
	})
}
