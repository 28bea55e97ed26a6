package policymap

import (
	"context"
	"fmt"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"
)

const (
	// refreshBatch is how many rows one write transaction marks for
	// refresh.
	refreshBatch = 1000
	// refreshRate is how many rows a second are marked for refresh at most,
	// so that a refresh of a large table does not crowd out changes.
	refreshRate = 10000
)

// refresher marks the Done rows of a table whose last status is older than
// the interval Refreshing, so that the reconciler writes them again (drift
// repair), as statedb's reconciler.WithRefreshing does, but up to
// refreshBatch rows in one write transaction where statedb takes one per
// row. A write transaction copies the tree nodes on each written row's path
// (for a table of 300,000 policy entries, about 13 KB of 256-way nodes a
// row): one transaction a row made a refresh of that table allocate 4 GB
// and hold the agent's heap at twice its size while it ran.
type refresher[E any] struct {
	db        *statedb.DB
	table     statedb.RWTable[E]
	interval  time.Duration
	limiter   *rate.Limiter
	clone     func(E) E
	setStatus func(E, reconciler.Status) E
	getStatus func(E) reconciler.Status

	commits int // write transactions so far
}

// RegisterReconciler registers a reconciler of table into its LPM maps
// with reconcilerOptions, and the batched refresh of the table.
func RegisterReconciler[E comparable](
	params reconciler.Params,
	jobs job.Group,
	cfg Config,
	name string,
	table statedb.RWTable[E],
	clone func(E) E,
	setStatus func(E, reconciler.Status) E,
	getStatus func(E) reconciler.Status,
	ops reconciler.Operations[E],
	batchOps reconciler.BatchOperations[E],
) (reconciler.Reconciler[E], error) {
	rec, err := reconciler.Register(params, table, clone, setStatus, getStatus, ops, batchOps, reconcilerOptions(cfg, name)...)
	if err != nil {
		return nil, err
	}
	r := &refresher[E]{db: params.DB, table: table, interval: cfg.BPFMapRefreshInterval,
		limiter: rate.NewLimiter(refreshRate, refreshBatch), clone: clone, setStatus: setStatus, getStatus: getStatus}
	jobs.Add(job.OneShot("refresh-"+name, r.run))
	return rec, nil
}

// run marks rows for refresh until ctx is done: the rows in revision
// order (oldest change first), until one is younger than the interval,
// then it waits until that one is due.
func (r *refresher[E]) run(ctx context.Context, health cell.Health) error {
	var last statedb.Revision
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		next, wait, err := r.pass(ctx, last)
		if err != nil {
			return nil // ctx done while waiting for the limiter
		}
		last = next
		timer.Reset(wait)
		health.OK(fmt.Sprintf("Next refresh in %s", wait.Round(time.Millisecond)))
	}
}

// pass marks the rows after revision last that are due, in batches. It
// returns the revision of the last row looked at and how long until the
// next one is due.
func (r *refresher[E]) pass(ctx context.Context, last statedb.Revision) (statedb.Revision, time.Duration, error) {
	wait := r.interval
	batch := make([]E, 0, refreshBatch)
	revs := make([]statedb.Revision, 0, refreshBatch)
	for obj, rev := range r.table.LowerBound(r.db.ReadTxn(), statedb.ByRevision[E](last+1)) {
		status := r.getStatus(obj)
		if since := time.Since(status.UpdatedAt); since < r.interval {
			wait = r.interval - since
			break
		}
		last = rev
		if status.Kind != reconciler.StatusKindDone {
			continue // pending or in error: the reconciler has it already
		}
		batch, revs = append(batch, obj), append(revs, rev)
		if len(batch) == refreshBatch {
			if err := r.mark(ctx, batch, revs); err != nil {
				return last, 0, err
			}
			batch, revs = batch[:0], revs[:0]
		}
	}
	if len(batch) > 0 {
		if err := r.mark(ctx, batch, revs); err != nil {
			return last, 0, err
		}
	}
	return last, wait, nil
}

// mark sets the rows Refreshing in one write transaction, those that have
// not changed since they were read.
func (r *refresher[E]) mark(ctx context.Context, batch []E, revs []statedb.Revision) error {
	if err := r.limiter.WaitN(ctx, len(batch)); err != nil {
		return err
	}
	indexer := r.table.PrimaryIndexer()
	wtxn := r.db.WriteTxn(r.table)
	defer wtxn.Abort()
	for i, obj := range batch {
		cur, rev, ok := r.table.Get(wtxn, indexer.QueryFromObject(obj))
		if ok && rev == revs[i] {
			r.table.Insert(wtxn, r.setStatus(r.clone(cur), reconciler.StatusRefreshing()))
		}
	}
	wtxn.Commit()
	r.commits++
	return nil
}
