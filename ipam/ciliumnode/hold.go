package ciliumnode

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/enimasq/enimasq/cells/filesource"
)

// lossHold keeps, for a grace period, what leaves the CiliumNode: an ENI,
// or pool IPs of one. A CiliumNode briefly cut short (a file rewritten in
// place, read while half written) would otherwise orphan every pod of the
// ENIs it lost, and their rules and routes would go until the rest of the
// file arrives. What comes back within the grace period was never lost;
// what stays away goes when the grace period ends (an ENI really detached:
// its pods' rules go that much later). Health says what is held, and until
// when.
type lossHold struct {
	grace time.Duration
	now   func() time.Time

	mu   sync.Mutex
	last map[string]*ENI // the ENIs last applied, held parts included
	// lostAt: since when an ENI (by ID) or a pool IP has been missing.
	enisLost map[string]time.Time
	ipsLost  map[netip.Addr]time.Time
}

func newLossHold(grace time.Duration) *lossHold {
	return &lossHold{grace: grace, now: time.Now, enisLost: map[string]time.Time{}, ipsLost: map[netip.Addr]time.Time{}}
}

// apply returns in with what left the CiliumNode less than grace ago put
// back (a copy: in is not changed), and notes the summary.
func (h *lossHold) apply(in *filesource.Input[*ENI]) *filesource.Input[*ENI] {
	if in == nil || h.grace <= 0 {
		return in
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	out := &filesource.Input[*ENI]{Warnings: in.Warnings, Summary: in.Summary, Incomplete: in.Incomplete}
	present := map[string]bool{}
	var heldENIs, heldIPs int
	var until time.Time
	hold := func(since time.Time) bool {
		if now.Sub(since) >= h.grace {
			return false
		}
		if end := since.Add(h.grace); until.IsZero() || end.Before(until) {
			until = end
		}
		return true
	}
	for _, e := range in.Rows {
		present[e.ID] = true
		delete(h.enisLost, e.ID)
		old, ok := h.last[e.ID]
		if !ok {
			out.Rows = append(out.Rows, e)
			continue
		}
		var kept []netip.Addr
		for _, ip := range old.Pool {
			if slices.Contains(e.Pool, ip) || !e.Usable() {
				continue
			}
			since, lost := h.ipsLost[ip]
			if !lost {
				since, h.ipsLost[ip] = now, now
			}
			if hold(since) {
				kept = append(kept, ip)
			} else {
				delete(h.ipsLost, ip) // gone for good
			}
		}
		for _, ip := range e.Pool {
			delete(h.ipsLost, ip)
		}
		if len(kept) == 0 {
			out.Rows = append(out.Rows, e)
			continue
		}
		merged := *e
		merged.Pool = append(slices.Clone(e.Pool), kept...)
		slices.SortFunc(merged.Pool, netip.Addr.Compare)
		out.Rows = append(out.Rows, &merged)
		heldIPs += len(kept)
	}
	for id, old := range h.last {
		if present[id] {
			continue
		}
		since, lost := h.enisLost[id]
		if !lost {
			since, h.enisLost[id] = now, now
		}
		if hold(since) {
			out.Rows = append(out.Rows, old)
			heldENIs++
		} else {
			delete(h.enisLost, id)
		}
	}
	slices.SortFunc(out.Rows, func(a, b *ENI) int {
		if a.Number != b.Number {
			return a.Number - b.Number
		}
		return cmp.Compare(a.ID, b.ID)
	})
	h.last = map[string]*ENI{}
	inPool := map[netip.Addr]bool{}
	for _, e := range out.Rows {
		h.last[e.ID] = e
		for _, ip := range e.Pool {
			inPool[ip] = true
		}
	}
	for ip := range h.ipsLost {
		if !inPool[ip] {
			delete(h.ipsLost, ip) // its ENI has gone too: held, or no more
		}
	}
	if heldENIs+heldIPs > 0 {
		out.Summary += fmt.Sprintf("; holding %d ENIs and %d pool IPs missing from the CiliumNode until %s (--ciliumnode-loss-grace %s)",
			heldENIs, heldIPs, until.Format(time.TimeOnly), h.grace)
	}
	return out
}

// next is when apply is to run again for a hold to end (0: no hold).
func (h *lossHold) next() time.Duration {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var first time.Time
	for _, since := range h.enisLost {
		if first.IsZero() || since.Before(first) {
			first = since
		}
	}
	for _, since := range h.ipsLost {
		if first.IsZero() || since.Before(first) {
			first = since
		}
	}
	if first.IsZero() {
		return 0
	}
	return max(first.Add(h.grace).Sub(h.now()), time.Millisecond)
}
