package bpf

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"math/rand/v2"
	"sync/atomic"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// ErrInjectedFault is wrapped by every error a [FaultInjector] makes up.
var ErrInjectedFault = errors.New("injected fault")

// FaultFunc decides whether an operation on a key fails: a non-nil error is
// returned (wrapped) as the entry's result and the kernel is not called.
type FaultFunc func(mapName string, key []byte) error

// FaultInjector wraps reconciler operations and makes Update, Delete and the
// entries of UpdateBatch and DeleteBatch fail before they reach the inner
// operations: at random with a probability, or for the keys a [FaultFunc]
// picks. Both can be changed while the reconciler runs. Prune is passed
// through. With no probability and no function it only forwards.
type FaultInjector[E Entry] struct {
	inner       ReconcilerOps[E]
	probability atomic.Uint64 // math.Float64bits of a value in [0, 1]
	fail        atomic.Pointer[FaultFunc]
}

var _ ReconcilerOps[Entry] = (*FaultInjector[Entry])(nil)

// NewFaultInjector wraps inner; it injects nothing until told to.
func NewFaultInjector[E Entry](inner ReconcilerOps[E]) *FaultInjector[E] {
	return &FaultInjector[E]{inner: inner}
}

// SetProbability sets the chance, from 0 (never) to 1 (always), that an
// operation on an entry fails with [ErrInjectedFault]. Values outside the
// range are clamped.
func (f *FaultInjector[E]) SetProbability(p float64) {
	if math.IsNaN(p) {
		p = 0
	}
	f.probability.Store(math.Float64bits(min(max(p, 0), 1)))
}

// Probability returns the chance set by SetProbability.
func (f *FaultInjector[E]) Probability() float64 {
	return math.Float64frombits(f.probability.Load())
}

// SetFaultFunc makes the keys fn picks fail; nil removes it.
func (f *FaultInjector[E]) SetFaultFunc(fn FaultFunc) {
	if fn == nil {
		f.fail.Store(nil)
		return
	}
	f.fail.Store(&fn)
}

func (f *FaultInjector[E]) active() bool {
	return f.probability.Load() != 0 || f.fail.Load() != nil
}

// fault returns the error to inject for e, or nil.
func (f *FaultInjector[E]) fault(op string, e E) error {
	name := e.MapName()
	if fn := f.fail.Load(); fn != nil {
		if err := (*fn)(name, e.MapKey()); err != nil {
			if !errors.Is(err, ErrInjectedFault) {
				err = fmt.Errorf("%w: %w", ErrInjectedFault, err)
			}
			return opError(op, name, e.MapKey(), err)
		}
	}
	if p := f.Probability(); p > 0 && rand.Float64() < p {
		return opError(op, name, e.MapKey(), ErrInjectedFault)
	}
	return nil
}

// Update fails with an injected fault or calls the inner Update.
func (f *FaultInjector[E]) Update(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, e E) error {
	if err := f.fault("update", e); err != nil {
		return err
	}
	return f.inner.Update(ctx, txn, rev, e)
}

// Delete fails with an injected fault or calls the inner Delete.
func (f *FaultInjector[E]) Delete(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, e E) error {
	if err := f.fault("delete", e); err != nil {
		return err
	}
	return f.inner.Delete(ctx, txn, rev, e)
}

// Prune calls the inner Prune.
func (f *FaultInjector[E]) Prune(ctx context.Context, txn statedb.ReadTxn, objects iter.Seq2[E, statedb.Revision]) error {
	return f.inner.Prune(ctx, txn, objects)
}

// UpdateBatch fails the picked entries and hands the others to the inner
// UpdateBatch.
func (f *FaultInjector[E]) UpdateBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[E]) {
	f.batch(ctx, txn, batch, "update", f.inner.UpdateBatch)
}

// DeleteBatch fails the picked entries and hands the others to the inner
// DeleteBatch.
func (f *FaultInjector[E]) DeleteBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[E]) {
	f.batch(ctx, txn, batch, "delete", f.inner.DeleteBatch)
}

func (f *FaultInjector[E]) batch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[E], op string,
	inner func(context.Context, statedb.ReadTxn, []reconciler.BatchEntry[E])) {
	if !f.active() {
		inner(ctx, txn, batch)
		return
	}
	rest := make([]reconciler.BatchEntry[E], 0, len(batch))
	pos := make([]int, 0, len(batch))
	for i := range batch {
		if err := f.fault(op, batch[i].Object); err != nil {
			batch[i].Result = err
			continue
		}
		rest = append(rest, batch[i])
		pos = append(pos, i)
	}
	if len(rest) == 0 {
		return
	}
	inner(ctx, txn, rest)
	for j, i := range pos {
		batch[i].Result = rest[j].Result
	}
}
