package bpf

import (
	"context"
	"iter"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// Map operations, as observed (OpObserver).
const (
	OpUpdate = "update"
	OpDelete = "delete"
	OpPrune  = "prune"
)

// OpObserver is told the outcome of every entry's operation: the map, the
// operation (OpUpdate, OpDelete, OpPrune) and its error (nil: success). A
// prune is one observation for its table, with map "".
type OpObserver func(mapName, op string, err error)

// ObservedOps forwards to inner and reports each entry's outcome to observe,
// batch entries one by one, so that metrics count the operations the kernel
// (or a fault injector in front of it) actually answered.
type ObservedOps[E Entry] struct {
	inner   ReconcilerOps[E]
	observe OpObserver
}

var _ ReconcilerOps[Entry] = (*ObservedOps[Entry])(nil)

// NewObservedOps wraps inner. A nil observe observes nothing.
func NewObservedOps[E Entry](inner ReconcilerOps[E], observe OpObserver) *ObservedOps[E] {
	if observe == nil {
		observe = func(string, string, error) {}
	}
	return &ObservedOps[E]{inner: inner, observe: observe}
}

func (o *ObservedOps[E]) Update(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, e E) error {
	err := o.inner.Update(ctx, txn, rev, e)
	o.observe(e.MapName(), OpUpdate, err)
	return err
}

func (o *ObservedOps[E]) Delete(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, e E) error {
	err := o.inner.Delete(ctx, txn, rev, e)
	o.observe(e.MapName(), OpDelete, err)
	return err
}

func (o *ObservedOps[E]) Prune(ctx context.Context, txn statedb.ReadTxn, objs iter.Seq2[E, statedb.Revision]) error {
	err := o.inner.Prune(ctx, txn, objs)
	o.observe("", OpPrune, err)
	return err
}

func (o *ObservedOps[E]) UpdateBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[E]) {
	o.inner.UpdateBatch(ctx, txn, batch)
	for _, b := range batch {
		o.observe(b.Object.MapName(), OpUpdate, b.Result)
	}
}

func (o *ObservedOps[E]) DeleteBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[E]) {
	o.inner.DeleteBatch(ctx, txn, batch)
	for _, b := range batch {
		o.observe(b.Object.MapName(), OpDelete, b.Result)
	}
}
