package celltest

import (
	"fmt"
	"strings"
	"sync"

	"github.com/cilium/hive/cell"
)

// Health is a cell.Health that keeps the last report, for tests that run a
// source outside a hive.
type Health struct {
	mu      sync.Mutex
	last    string
	changed chan struct{} // closed at the next report; nil until watched
}

func (h *Health) set(s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = s
	if h.changed != nil {
		close(h.changed)
		h.changed = nil
	}
}

// Watch returns the last report and a channel closed at the next one.
func (h *Health) Watch() (string, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.changed == nil {
		h.changed = make(chan struct{})
	}
	return h.last, h.changed
}

// Get returns the last report: "OK: status", "Degraded: reason: error" or
// "Stopped: reason".
func (h *Health) Get() string { h.mu.Lock(); defer h.mu.Unlock(); return h.last }

func (h *Health) OK(status string)      { h.set("OK: " + status) }
func (h *Health) Stopped(reason string) { h.set("Stopped: " + reason) }
func (h *Health) Degraded(reason string, err error) {
	if err != nil && strings.HasSuffix(reason, err.Error()) {
		h.set("Degraded: " + reason) // the reason says the error already
		return
	}
	h.set(fmt.Sprintf("Degraded: %s: %v", reason, err))
}
func (h *Health) NewScope(string) cell.Health { return h }
func (h *Health) Close()                      {}
