package policymap

import (
	"fmt"
	"log/slog"
	"maps"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
)

// mapOps are the LPM reconciler operations of one table, with the fault
// injector in front (inactive unless --bpf-map-fault-probability or a test
// sets it) and the maps the cell opened.
type mapOps[E bpf.Entry] struct {
	inner  *bpf.Ops[E]
	faults *bpf.FaultInjector[E]
	mu     sync.Mutex
	maps   map[string]*ebpf.Map // the maps the cell opened, by name; under mu
}

func newMapOps[E bpf.Entry](cfg Config) *mapOps[E] {
	inner := bpf.NewOps[E](nil)
	faults := bpf.NewFaultInjector[E](inner)
	faults.SetProbability(cfg.BPFMapFaultProbability)
	return &mapOps[E]{inner: inner, faults: faults, maps: map[string]*ebpf.Map{}}
}

// open opens (or creates) the pinned map and hands it to the operations.
// Called from start hooks, before the reconciler runs.
func (o *mapOps[E]) open(log *slog.Logger, spec *ebpf.MapSpec, dir string) error {
	m, err := bpf.OpenPinned(log, spec, dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", spec.Name, err)
	}
	o.mu.Lock()
	o.maps[spec.Name] = m
	o.mu.Unlock()
	o.inner.SetMap(spec.Name, m)
	return nil
}

// openMaps is a copy of the open maps, for the shell and script commands,
// which run concurrently with start and stop.
func (o *mapOps[E]) openMaps() map[string]*ebpf.Map {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.maps)
}

func (o *mapOps[E]) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for name, m := range o.maps {
		o.inner.SetMap(name, nil)
		m.Close()
	}
	clear(o.maps)
}
