package enforce

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
)

// failFilterDumps makes every tc filter dump fail (a fault-injecting fake
// of the dump, as a kernel or a netlink socket failing would) while
// failing is set.
func failFilterDumps(t *testing.T) *atomic.Bool {
	t.Helper()
	var failing atomic.Bool
	real := listFilters
	listFilters = func(l netlink.Link, parent uint32) ([]netlink.Filter, error) {
		if failing.Load() {
			return nil, errors.New("tc filter list: injected dump failure")
		}
		return real(l, parent)
	}
	t.Cleanup(func() { listFilters = real })
	return &failing
}

// A tc filter dump that fails is an error, never "no filters": the row
// stays in error (retried; the module Degraded), its filter is neither
// replaced blind nor taken for gone, and Delete and Uninstall fail rather
// than report a filter removed that is still on the device.
func TestPrivilegedTCFilterDumpErrorIsError(t *testing.T) {
	e := newTCXEnv(t)
	e.ops.settings.Attach = AttachTC
	failing := failFilterDumps(t)
	if err := e.update(e.ops); err != nil {
		t.Fatalf("attach with the tc fallback: %s", err)
	}
	failing.Store(true)
	err := e.update(e.ops)
	if err == nil || !strings.Contains(err.Error(), "injected dump failure") {
		t.Errorf("refresh with the filter dump failing: error %v, want the dump's", err)
	}
	err = e.in(func() error { return e.ops.Delete(context.Background(), nil, 0, e.att) })
	if err == nil || !strings.Contains(err.Error(), "injected dump failure") {
		t.Errorf("delete with the filter dump failing: error %v, want the dump's (the filter is still there)", err)
	}
	var removed []string
	err = e.in(func() (err error) { removed, err = Uninstall(e.ops.settings.LinksDir); return err })
	if err == nil || !strings.Contains(err.Error(), "injected dump failure") {
		t.Errorf("uninstall with the filter dump failing: error %v (removed %v), want the dump's", err, removed)
	}
	err = e.in(func() error {
		return e.ops.Prune(context.Background(), nil, func(func(*Attachment, uint64) bool) {})
	})
	if err == nil || !strings.Contains(err.Error(), "injected dump failure") {
		t.Errorf("prune with the filter dump failing: error %v, want the dump's", err)
	}
	failing.Store(false)
	for _, h := range hooks {
		if fs := e.filters(h); len(fs) != 1 || !strings.Contains(fs[0], `"enimasq-policy"`) {
			t.Errorf("%s: filters %v, want enimasq's still there", h.name, fs)
		}
	}
	// The dump works again: the retry is Done, the delete removes them.
	if err := e.update(e.ops); err != nil {
		t.Errorf("retry with the dump working: %s", err)
	}
	if err := e.in(func() error { return e.ops.Delete(context.Background(), nil, 0, e.att) }); err != nil {
		t.Errorf("delete with the dump working: %s", err)
	}
	for _, h := range hooks {
		if fs := e.filters(h); len(fs) != 0 {
			t.Errorf("%s: filters %v after the delete", h.name, fs)
		}
	}
}
