package policymap

import (
	"fmt"
	"log/slog"
	"maps"
	"sync"

	"errors"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/metrics"
)

// Maps are the LPM maps of one table and the reconciler operations over
// them, with the fault injector in front (inactive unless
// --bpf-map-fault-probability or a test sets it). Every map feature holds
// one: it opens its maps in a start hook, registers a reconciler with
// [Maps.Ops] through [RegisterReconciler], checks the pins with a timer job, and
// exports [TableMetrics].
type Maps[E bpf.Entry] struct {
	inner  *bpf.Ops[E]
	faults *bpf.FaultInjector[E]
	// ops is what the reconciler calls: the fault injector, observed by
	// the map-operation metrics.
	ops     *bpf.ObservedOps[E]
	metrics *metrics.MapOps
	mu      sync.Mutex
	store   bpf.MapStore
	maps    map[string]bpf.PinnedMap // the maps the cell opened, by name; under mu
	pins    map[string]string        // their pin paths, by name; under mu
}

// MapsParams are what [NewMaps] needs from the hive.
type MapsParams struct {
	cell.In

	Config Config
	// Store is where the maps live: the kernel unless a test provides a
	// fake (bpffake.FakeStore).
	Store bpf.MapStore `optional:"true"`
}

// NewMaps returns the maps of the named table, none open yet.
func NewMaps[E bpf.Entry](p MapsParams, table string) *Maps[E] {
	cfg, store := p.Config, p.Store
	if store == nil {
		store = bpf.KernelStore{}
	}
	inner := bpf.NewOps[E](nil)
	faults := bpf.NewFaultInjector[E](inner)
	faults.SetProbability(cfg.BPFMapFaultProbability)
	m := metrics.NewMapOps(table)
	return &Maps[E]{inner: inner, faults: faults, ops: bpf.NewObservedOps[E](faults, m.Observe), metrics: m,
		store: store, maps: map[string]bpf.PinnedMap{}, pins: map[string]string{}}
}

// CheckPins makes sure that the pin of every open map is the very map the
// reconciler writes (same map ID). A missing pin (deleted, or a bpffs
// remounted empty) is pinned again; a pin holding another map (a foreign or
// incompatible one) is replaced by ours, with a warning naming what was
// there. Our map keeps its entries either way, so the pinned map is whole at
// once. A loaded program that held the replaced map keeps it: it sees our
// map when it is loaded again (Cilium reloads its datapath at start and
// replaces a map of another spec the same way). An error (no bpffs at the
// path) is returned, for health, and checked again at the next interval.
func (o *Maps[E]) CheckPins(log *slog.Logger) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	var errs []error
	for name, m := range o.maps {
		path := o.pins[name]
		pinned, err := o.store.LoadPinned(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			log.Warn("Pin of a BPF map missing: pinning it again", "map", name, "path", path)
		case err != nil:
			log.Warn("Pin of a BPF map unreadable: replacing it", "map", name, "path", path, "error", err)
		default:
			ourID, err1 := m.MapID()
			theirID, err2 := pinned.MapID()
			theirs := pinned.Describe()
			if pinned != m {
				pinned.Close()
			}
			if err := errors.Join(err1, err2); err != nil {
				errs = append(errs, fmt.Errorf("check pin %s: %w", path, err))
				continue
			}
			if ourID == theirID {
				continue
			}
			log.Warn("Another map is pinned in place of ours: replacing it", "map", name, "path", path,
				"pinned", fmt.Sprintf("id=%d %s", theirID, theirs), "ours", fmt.Sprintf("id=%d", ourID))
		}
		if err := o.store.Pin(m, path); err != nil {
			errs = append(errs, fmt.Errorf("pin %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// maxEntries are the open maps and their sizes, for the pressure metric.
func (o *Maps[E]) maxEntries() map[string]uint32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]uint32, len(o.maps))
	for name, m := range o.maps {
		out[name] = m.MaxEntries()
	}
	return out
}

// TableMetrics are the collectors of a map table: its rows by status, its
// maps' operations and pressure.
func TableMetrics[E interface {
	bpf.Entry
	GetStatus() reconciler.Status
}](db *statedb.DB, table statedb.Table[E], ops *Maps[E]) metrics.Outs {
	ops.metrics.Seed(ops.maxEntries)
	return metrics.Outs{Collectors: []prometheus.Collector{
		metrics.TableRows(db, table, func(e E) (reconciler.Status, bool) { return e.GetStatus(), e.MapName() != "" }),
		newPressureCollector(db, table, ops), // pressure.go
		ops.metrics,
	}}
}

// Open opens (or creates) the pinned map and hands it to the operations.
// Called from start hooks, before the reconciler runs.
func (o *Maps[E]) Open(log *slog.Logger, spec *ebpf.MapSpec, dir string) error {
	m, err := o.store.OpenPinned(log, spec, dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", spec.Name, err)
	}
	o.mu.Lock()
	o.maps[spec.Name] = m
	o.pins[spec.Name] = filepath.Join(dir, spec.Name)
	o.mu.Unlock()
	o.inner.SetMap(spec.Name, m)
	return nil
}

// OpenSpill opens (or creates) a pinned spill map: the chunks of the
// values too long for a map value (bpf.Spiller), written before their
// entries and pruned against them.
func (o *Maps[E]) OpenSpill(log *slog.Logger, spec *ebpf.MapSpec, dir string) error {
	o.inner.SetSpillMap(spec.Name)
	return o.Open(log, spec, dir)
}

// Opened is a copy of the open maps, for the shell and script commands,
// which run concurrently with start and stop.
func (o *Maps[E]) Opened() map[string]bpf.PinnedMap {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.maps)
}

// Close closes the maps (their pins stay), from stop hooks.
func (o *Maps[E]) Close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for name, m := range o.maps {
		o.inner.SetMap(name, nil)
		m.Close()
	}
	clear(o.maps)
}

// Ops is what the reconciler calls: the operations behind the fault
// injector, observed by the map-operation metrics.
func (o *Maps[E]) Ops() *bpf.ObservedOps[E] { return o.ops }

// SetKeep sets the keys the prune keeps though no row holds them (see
// bpf.Ops.SetKeep).
func (o *Maps[E]) SetKeep(k bpf.KeepFunc) { o.inner.SetKeep(k) }

// Faults is the fault injector in front of the operations, for the
// script commands and tests.
func (o *Maps[E]) Faults() *bpf.FaultInjector[E] { return o.faults }

// reconcilerOptions are the options every LPM map reconciler uses. The
// refresh is not statedb's but RegisterReconciler's (batched).
func reconcilerOptions(cfg Config, name string) []reconciler.Option {
	return []reconciler.Option{
		reconciler.WithName(name),
		reconciler.WithRetry(cfg.BPFMapRetryMin, cfg.BPFMapRetryMax),
		// Pruning only runs once the table is initialized, i.e. once its
		// source is: a restart never empties a map before the desired state
		// is loaded.
		reconciler.WithPruning(cfg.BPFMapRefreshInterval),
		// The default limit (1000 rounds/s) is the floor of a change's
		// latency; batches make rounds cheap.
		reconciler.WithRoundLimits(1024, rate.NewLimiter(rate.Inf, 1)),
	}
}

// Interpose makes the operations write m in place of the opened map of that
// name: tests and benchmarks wrap the opened map to count, record or fail
// the operations.
func (o *Maps[E]) Interpose(name string, m bpf.Map) { o.inner.SetMap(name, m) }
