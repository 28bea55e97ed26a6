package kernel_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/infra"
	"github.com/enimasq/enimasq/cells/kernel"
)

// fakeSource is a kernel of a link, an address, routes and rules that the
// test changes, announcing what it likes.
type fakeSource struct {
	mu          sync.Mutex
	routes      []netlink.Route
	subscribes  int
	subscribeOK bool
	changes     chan []kernel.Change
	fail        chan error
}

func newFakeSource() *fakeSource {
	return &fakeSource{subscribeOK: true, changes: make(chan []kernel.Change, 16), fail: make(chan error, 1)}
}

func (f *fakeSource) Subscribe(kernel.Groups) (kernel.Subscription, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subscribes++
	if !f.subscribeOK {
		return nil, errors.New("no socket")
	}
	return f, nil
}

func (f *fakeSource) Receive(ctx context.Context) ([]kernel.Change, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case c := <-f.changes:
		return c, nil
	case err := <-f.fail:
		return nil, err
	}
}

func (f *fakeSource) Close() error { return nil }

func (f *fakeSource) LinkList() ([]netlink.Link, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Index, attrs.Name = 2, "veth0"
	attrs.HardwareAddr, _ = net.ParseMAC("02:00:00:00:00:01")
	return []netlink.Link{&netlink.Veth{LinkAttrs: attrs}}, nil
}

func (f *fakeSource) AddrList(netlink.Link, int) ([]netlink.Addr, error) {
	a, _ := netlink.ParseAddr("192.0.2.1/24")
	a.LinkIndex = 2
	return []netlink.Addr{*a}, nil
}

func (f *fakeSource) RouteListFiltered(family int, _ *netlink.Route, _ uint64) ([]netlink.Route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netlink.Route
	for _, r := range f.routes {
		if r.Family == family {
			out = append(out, r)
		}
	}
	return out, nil
}

func (f *fakeSource) RuleList(family int) ([]netlink.Rule, error) {
	if family != unix.AF_INET {
		return nil, nil
	}
	r := netlink.NewRule()
	r.Family, r.Priority, r.Table = family, 32766, unix.RT_TABLE_MAIN
	return []netlink.Rule{*r}, nil
}

func (f *fakeSource) addRoute(dst string) {
	_, n, _ := net.ParseCIDR(dst)
	f.mu.Lock()
	f.routes = append(f.routes, netlink.Route{Family: unix.AF_INET, Table: unix.RT_TABLE_MAIN, Dst: n, LinkIndex: 2})
	f.mu.Unlock()
}

func start(t *testing.T, src kernel.Source) (*statedb.DB, statedb.Table[*kernel.Route], statedb.Table[*kernel.Link]) {
	t.Helper()
	var (
		db     *statedb.DB
		routes statedb.Table[*kernel.Route]
		links  statedb.Table[*kernel.Link]
	)
	h := infra.New(infra.Core, kernel.Cell,
		cell.Provide(func() kernel.Source { return src }),
		cell.Invoke(func(d *statedb.DB, r statedb.Table[*kernel.Route], l statedb.Table[*kernel.Link]) {
			db, routes, links = d, r, l
		}))
	log := hivetest.Logger(t, hivetest.LogLevel(slog.LevelError))
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(log, context.Background()) })
	return db, routes, links
}

// waitRoutes waits until kernel-routes is initialized and holds the
// destinations want.
func waitRoutes(t *testing.T, db *statedb.DB, routes statedb.Table[*kernel.Route], want ...string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		txn := db.ReadTxn()
		var got []string
		rows, watch := routes.AllWatch(txn)
		for r := range rows {
			got = append(got, r.Dst.String())
		}
		slices.Sort(got)
		if init, _ := routes.Initialized(txn); init && slices.Equal(got, want) {
			return
		}
		select {
		case <-watch:
		case <-deadline:
			t.Fatalf("routes %v, want %v", got, want)
		}
	}
}

// The tables follow the source's notifications; lost notifications and a
// failed socket list everything again; one subscription at a time.
func TestTablesFollowTheSource(t *testing.T) {
	src := newFakeSource()
	src.addRoute("10.0.0.1/32")
	db, routes, links := start(t, src)
	waitRoutes(t, db, routes, "10.0.0.1/32")
	if l, _, ok := links.Get(db.ReadTxn(), kernel.LinkIndex.Query(2)); !ok || l.Name != "veth0" || l.Type != "veth" {
		t.Errorf("link 2: %+v %t", l, ok)
	}

	src.addRoute("10.0.0.2/32")
	src.changes <- []kernel.Change{kernel.RouteAdded}
	waitRoutes(t, db, routes, "10.0.0.1/32", "10.0.0.2/32")

	// Not announced, but notifications were lost: listed again.
	src.addRoute("10.0.0.3/32")
	src.changes <- []kernel.Change{kernel.ChangesLost}
	waitRoutes(t, db, routes, "10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32")

	// The socket fails: a new one, and everything listed again.
	src.addRoute("10.0.0.4/32")
	src.fail <- errors.New("socket gone")
	waitRoutes(t, db, routes, "10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32", "10.0.0.4/32")
	src.mu.Lock()
	n := src.subscribes
	src.mu.Unlock()
	if n != 2 {
		t.Errorf("%d subscriptions, want 2 (the first, and one after the failure)", n)
	}
}

// Without a subscription the tables are still listed, every second.
func TestTablesListedWithoutSubscription(t *testing.T) {
	src := newFakeSource()
	src.subscribeOK = false
	src.addRoute("10.0.0.1/32")
	db, routes, _ := start(t, src)
	waitRoutes(t, db, routes, "10.0.0.1/32")
	src.addRoute("10.0.0.2/32")
	waitRoutes(t, db, routes, "10.0.0.1/32", "10.0.0.2/32")
}
