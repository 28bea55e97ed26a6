package netlinkfake

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/enimasq/enimasq/cells/kernel"
)

// fakeSubscription is a subscription to a Netlink's changes: an
// unbounded queue (the fake loses no notification).
type fakeSubscription struct {
	f        *Netlink
	families []int
	routes   bool

	mu      sync.Mutex
	pending []kernel.Change
	closed  bool
	wake    chan struct{} // one signal covers every queued change
}

var errSubscriptionClosed = errors.New("fake netlink: subscription closed")

// Subscribe subscribes to the changes of the rules of the groups'
// families and, with Routes, of their routes and of links (addresses are
// not modelled: none is announced).
func (f *Netlink) Subscribe(g kernel.Groups) (kernel.Subscription, error) {
	s := &fakeSubscription{f: f, families: slices.Clone(g.Families), routes: g.Routes, wake: make(chan struct{}, 1)}
	f.mu.Lock()
	f.subs[s] = struct{}{}
	f.mu.Unlock()
	return s, nil
}

// wants says whether the subscription's groups include the change (a
// family of 0: a link's).
func (s *fakeSubscription) wants(c kernel.Change, family int) bool {
	switch c {
	case kernel.RuleAdded, kernel.RuleDeleted:
		return slices.Contains(s.families, family)
	case kernel.RouteAdded, kernel.RouteDeleted:
		return s.routes && slices.Contains(s.families, family)
	default:
		return s.routes
	}
}

// emit delivers a change to the subscriptions that want it; f.mu is held,
// so every subscription sees the changes in the order they were made.
func (f *Netlink) emit(c kernel.Change, family int) {
	for s := range f.subs {
		if !s.wants(c, family) {
			continue
		}
		s.mu.Lock()
		s.pending = append(s.pending, c)
		s.mu.Unlock()
		wake(s.wake)
	}
}

func (s *fakeSubscription) Receive(ctx context.Context) ([]kernel.Change, error) {
	for {
		s.mu.Lock()
		changes, closed := s.pending, s.closed
		s.pending = nil
		s.mu.Unlock()
		switch {
		case len(changes) > 0:
			return changes, nil
		case closed:
			return nil, errSubscriptionClosed
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.wake:
		}
	}
}

func (s *fakeSubscription) Close() error {
	s.f.mu.Lock()
	delete(s.f.subs, s)
	s.f.mu.Unlock()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	wake(s.wake)
	return nil
}

// deleteFirst removes the first entry of *list that match takes, as the
// kernel's delete does, and emits change; notFound when none matches.
func deleteFirst[T any](f *Netlink, list *[]T, match func(T) bool, notFound error, change kernel.Change, family int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(*list, match)
	if i < 0 {
		return notFound
	}
	*list = slices.Delete(*list, i, i+1)
	f.emit(change, family)
	return nil
}
