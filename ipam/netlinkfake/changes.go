package netlinkfake

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/enimasq/enimasq/ipam/datapath"
)

// fakeSubscription is a subscription to a Netlink's changes: an
// unbounded queue (the fake loses no notification).
type fakeSubscription struct {
	f        *Netlink
	families []int
	routes   bool

	mu      sync.Mutex
	pending []datapath.NetlinkChange
	closed  bool
	wake    chan struct{} // one signal covers every queued change
}

var errSubscriptionClosed = errors.New("fake netlink: subscription closed")

// SubscribeChanges subscribes to the changes of the rules of families and,
// with routes, of their routes and of links.
func (f *Netlink) SubscribeChanges(families []int, routes bool) (datapath.NetlinkSubscription, error) {
	s := &fakeSubscription{f: f, families: slices.Clone(families), routes: routes, wake: make(chan struct{}, 1)}
	f.mu.Lock()
	f.subs[s] = struct{}{}
	f.mu.Unlock()
	return s, nil
}

// wants says whether the subscription's groups include the change (a
// family of 0: a link's).
func (s *fakeSubscription) wants(c datapath.NetlinkChange, family int) bool {
	switch c {
	case datapath.RuleAdded, datapath.RuleDeleted:
		return slices.Contains(s.families, family)
	case datapath.RouteAdded, datapath.RouteDeleted:
		return s.routes && slices.Contains(s.families, family)
	default:
		return s.routes
	}
}

// emit delivers a change to the subscriptions that want it; f.mu is held,
// so every subscription sees the changes in the order they were made.
func (f *Netlink) emit(c datapath.NetlinkChange, family int) {
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

func (s *fakeSubscription) Receive(ctx context.Context) ([]datapath.NetlinkChange, error) {
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
func deleteFirst[T any](f *Netlink, list *[]T, match func(T) bool, notFound error, change datapath.NetlinkChange, family int) error {
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
