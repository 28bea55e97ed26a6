package policymap

import (
	"fmt"
	"log/slog"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
)

// mapOps are the LPM reconciler operations of one table, with the fault
// injector in front (inactive unless --bpf-map-fault-probability or a test
// sets it) and the maps the cell opened.
type mapOps[E bpf.Entry] struct {
	inner  *bpf.Ops[E]
	faults *bpf.FaultInjector[E]
	maps   map[string]*ebpf.Map // the maps the cell opened, by name
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
	o.maps[spec.Name] = m
	o.inner.SetMap(spec.Name, m)
	return nil
}

func (o *mapOps[E]) close() {
	for name, m := range o.maps {
		o.inner.SetMap(name, nil)
		m.Close()
	}
	clear(o.maps)
}
