package celltest

import (
	"fmt"
	"sync"

	"github.com/cilium/hive/cell"
)

// Health is a cell.Health that keeps the last report, for tests that run a
// source outside a hive.
type Health struct {
	mu   sync.Mutex
	last string
}

func (h *Health) set(s string) { h.mu.Lock(); h.last = s; h.mu.Unlock() }

// Get returns the last report: "OK: status", "Degraded: reason: error" or
// "Stopped: reason".
func (h *Health) Get() string { h.mu.Lock(); defer h.mu.Unlock(); return h.last }

func (h *Health) OK(status string)      { h.set("OK: " + status) }
func (h *Health) Stopped(reason string) { h.set("Stopped: " + reason) }
func (h *Health) Degraded(reason string, err error) {
	h.set(fmt.Sprintf("Degraded: %s: %v", reason, err))
}
func (h *Health) NewScope(string) cell.Health { return h }
func (h *Health) Close()                      {}
