package compile

import "net/netip"

// podQueue holds the pod IPs to recompile, as batches worked oldest first:
// no change waits behind newer ones. A pod queued again while it is due
// stays where it is (its recompile reads the objects as they are then, so
// it takes the newer change too): coalescing merges, never starves. A
// batch that has had a turn and has work left goes behind the others at
// the next round, so a large change (a chunk a round) never holds up a
// small one behind it for more than a chunk. A pod whose rows are more
// than a chunk keeps the rest of them in its batch (partial), written
// before the batch's next pod.
type podQueue[K entryKind] struct {
	batches []*podBatch[K]
	due     map[netip.Addr]uint64 // pod -> the batch it is due in
	partial map[netip.Addr]*podBatch[K]
	seq     uint64
	round   uint64 // the transactions worked so far
}

type podBatch[K entryKind] struct {
	seq     uint64
	pods    []netip.Addr
	partial *podWrite[K]
	// worked is the round that first took work from the batch (0: none
	// yet): the batch is fresh, a new change, during that round.
	worked uint64
	// turn is the last round that took work from it.
	turn uint64
}

func (q *podQueue[K]) push(pods []netip.Addr) {
	if len(pods) == 0 {
		return
	}
	if q.due == nil {
		q.due = map[netip.Addr]uint64{}
	}
	q.seq++
	var queued []netip.Addr
	for _, p := range pods {
		if b := q.partial[p]; b != nil { // recompiled anew: the rest is stale
			b.partial = nil
			delete(q.partial, p)
		}
		if _, due := q.due[p]; due {
			continue // worked where it is, with this change
		}
		q.due[p] = q.seq
		queued = append(queued, p)
	}
	if len(queued) > 0 {
		q.batches = append(q.batches, &podBatch[K]{seq: q.seq, pods: queued})
	}
}

// next starts a round: a batch that had its turn in an earlier round and
// has work left goes behind the others.
func (q *podQueue[K]) next() {
	q.round++
	if b := q.front(); b != nil && b.turn != 0 && len(q.batches) > 1 {
		copy(q.batches, q.batches[1:])
		q.batches[len(q.batches)-1] = b
	}
}

// front drops the work done at the front of the queue and returns the
// batch the next work comes from; nil when there is none.
func (q *podQueue[K]) front() *podBatch[K] {
	for len(q.batches) > 0 {
		if b := q.batches[0]; q.hasPods(b) {
			return b
		}
		q.batches[0] = nil
		q.batches = q.batches[1:]
	}
	*q = podQueue[K]{seq: q.seq, round: q.round} // a map does not shrink: drop it with the batches
	return nil
}

// hasPods drops the pods of b due in another batch and reports whether b
// has work left.
func (q *podQueue[K]) hasPods(b *podBatch[K]) bool {
	if b.partial != nil {
		return true
	}
	for len(b.pods) > 0 && q.due[b.pods[0]] != b.seq {
		b.pods = b.pods[1:] // due in another batch
	}
	return len(b.pods) > 0
}

// firstFresh returns the oldest batch of a new change with work: none
// taken from it before this round (untouched: none ever).
func (q *podQueue[K]) firstFresh(untouched bool) *podBatch[K] {
	for _, b := range q.batches {
		if (b.worked == 0 || !untouched && q.fresh(b)) && q.hasPods(b) {
			return b
		}
	}
	return nil
}

// fresh reports whether b is a new change: no work taken from it before
// this round.
func (q *podQueue[K]) fresh(b *podBatch[K]) bool { return b.worked == 0 || b.worked == q.round }

// hasWork reports whether there is work for the next round; with
// onlyFresh, work of a new change.
func (q *podQueue[K]) hasWork(onlyFresh bool) bool {
	if onlyFresh {
		return q.firstFresh(true) != nil
	}
	return q.front() != nil
}

// pop returns the next work: a pod to recompile, or the rest of a pod's
// rows (w), and its batch; with onlyFresh, only from a new change.
func (q *podQueue[K]) pop(onlyFresh bool) (pod netip.Addr, w *podWrite[K], b *podBatch[K], ok bool) {
	if onlyFresh {
		b = q.firstFresh(false)
	} else {
		b = q.front()
	}
	if b == nil {
		return netip.Addr{}, nil, nil, false
	}
	if b.worked == 0 {
		b.worked = q.round
	}
	b.turn = q.round
	if w = q.resume(b); w != nil {
		return w.pod, w, b, true
	}
	pod = b.pods[0]
	b.pods = b.pods[1:]
	delete(q.due, pod)
	return pod, nil, b, true
}

// resume takes the rest of a pod's rows out of batch b; nil if none.
func (q *podQueue[K]) resume(b *podBatch[K]) *podWrite[K] {
	w := b.partial
	if w != nil {
		b.partial = nil
		delete(q.partial, w.pod)
	}
	return w
}

// suspend keeps the rest of a pod's rows in its batch, b.
func (q *podQueue[K]) suspend(b *podBatch[K], w *podWrite[K]) {
	if q.partial == nil {
		q.partial = map[netip.Addr]*podBatch[K]{}
	}
	b.partial = w
	q.partial[w.pod] = b
}

func (q *podQueue[K]) empty() bool { return len(q.due) == 0 && len(q.partial) == 0 }
