package kernel

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
)

// retryInterval is how long the watcher waits before it lists again after a
// failed dump, or subscribes again after the socket failed.
const retryInterval = time.Second

// watcher keeps the tables equal to the kernel: it lists every kind at
// start and, after each batch of notifications, the kinds they made stale
// (a burst of changes is one listing, whoever reads the tables). Lost
// notifications (the socket overflowed) make every kind stale; a socket that
// fails is opened again and every kind listed.
type watcher struct {
	log      *slog.Logger
	db       *statedb.DB
	tables   *Tables
	src      Source
	initDone func(statedb.WriteTxn)

	// subscribed is closed by subscribe; then sub is set, or subErr.
	subscribed chan struct{}
	sub        Subscription
	subErr     error
}

// groups are the notifications the one subscription listens to.
var groups = Groups{Families: families, Routes: true, Addrs: true}

func (w *watcher) subscribe() {
	defer close(w.subscribed)
	w.sub, w.subErr = w.src.Subscribe(groups)
}

// stale collects the kinds that notifications made stale, for the loop to
// take.
type stale struct {
	mu    sync.Mutex
	kinds kindSet
	wake  chan struct{}
}

func (s *stale) add(k kindSet) {
	s.mu.Lock()
	s.kinds |= k
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *stale) take() kindSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.kinds
	s.kinds = 0
	return k
}

func (w *watcher) run(ctx context.Context, health cell.Health) error {
	select {
	case <-ctx.Done():
		return nil
	case <-w.subscribed:
	}
	sub, err := w.sub, w.subErr
	pending := &stale{kinds: allKinds, wake: make(chan struct{}, 1)}
	pending.wake <- struct{}{}
	var retry <-chan time.Time
	for {
		if sub == nil {
			// No notifications: list everything now and then, until a
			// subscription holds.
			pending.add(allKinds)
			if rerr := w.resync(pending, health); rerr != nil {
				err = fmt.Errorf("%w; listing the kernel's state: %w", err, rerr)
			}
			health.Degraded("no kernel notifications: subscribing again, listing every second meanwhile", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(retryInterval):
			}
			if sub, err = w.src.Subscribe(groups); sub != nil {
				pending.add(allKinds)
			}
			continue
		}
		readerDone := make(chan error, 1)
		readerCtx, stopReader := context.WithCancel(ctx)
		go func() { readerDone <- w.read(readerCtx, sub, pending) }()
	loop:
		for {
			select {
			case <-ctx.Done():
				stopReader()
				<-readerDone
				sub.Close()
				return nil
			case err = <-readerDone:
				break loop
			case <-retry:
				retry = nil
				pending.add(0)
			case <-pending.wake:
				if retry != nil {
					continue
				}
				if err := w.resync(pending, health); err != nil {
					health.Degraded("listing the kernel's state", err)
					retry = time.After(retryInterval)
				}
			}
		}
		stopReader()
		sub.Close()
		w.log.Warn("Kernel notifications stopped; subscribing again", "error", err)
		// What changed meanwhile went unheard: everything is listed again.
		pending.add(allKinds)
		sub, err = w.src.Subscribe(groups)
	}
}

// read delivers the subscription's changes to pending until ctx ends or the
// socket fails.
func (w *watcher) read(ctx context.Context, sub Subscription, pending *stale) error {
	for {
		changes, err := sub.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		var k kindSet
		for _, c := range changes {
			k |= c.kinds()
		}
		pending.add(k)
	}
}

// resync lists the stale kinds and writes them; on an error they stay stale.
func (w *watcher) resync(pending *stale, health cell.Health) error {
	kinds := pending.take()
	if kinds == 0 {
		return nil
	}
	snap, err := dump(w.src, kinds)
	if err != nil {
		pending.add(kinds)
		return err
	}
	wtxn := w.db.WriteTxn(w.tables.Links, w.tables.Addrs, w.tables.Routes, w.tables.Rules)
	if n := snap.write(wtxn, w.tables); n > 0 {
		w.log.Debug("Kernel state changed", "listed", kinds.String(), "rows-changed", n)
	}
	if w.initDone != nil && kinds == allKinds {
		w.initDone(wtxn)
		w.initDone = nil
	}
	wtxn.Commit()
	txn := w.db.ReadTxn()
	health.OK(fmt.Sprintf("%d links, %d addresses, %d routes, %d rules", w.tables.Links.NumObjects(txn),
		w.tables.Addrs.NumObjects(txn), w.tables.Routes.NumObjects(txn), w.tables.Rules.NumObjects(txn)))
	return nil
}
