package bpf

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"

	"github.com/cilium/ebpf"
)

// PinnedMap is a map the reconciler writes, as a [MapStore] hands it out:
// the operations of [Map], the value lookup of the kernel listing, and what
// the pin check needs.
type PinnedMap interface {
	Map
	Lookup(key, valueOut any) error
	// MapID identifies the map in its store (the kernel's map ID).
	MapID() (uint32, error)
	// Describe is the map's type, sizes and flags, for logs.
	Describe() string
	Close() error
}

// MapStore is where the maps live and are pinned: the kernel's bpffs
// ([KernelStore]) or, for tests without root, an in-memory fake
// (bpffake.FakeStore). The map features open their maps through it, check their
// pins through it, and the script commands act behind their backs through
// it.
type MapStore interface {
	// OpenPinned opens the map of spec pinned at dir/spec.Name, or creates
	// and pins it (see [OpenPinned]).
	OpenPinned(log *slog.Logger, spec *ebpf.MapSpec, dir string) (PinnedMap, error)
	// LoadPinned opens the map pinned at path; an error wrapping
	// os.ErrNotExist when nothing is.
	LoadPinned(path string) (PinnedMap, error)
	// Create makes a map of spec, not pinned.
	Create(spec *ebpf.MapSpec) (PinnedMap, error)
	// Pin pins m at path in place of whatever is pinned there.
	Pin(m PinnedMap, path string) error
	// Unpin removes the pin at path (the map lives on while open).
	Unpin(path string) error
}

// KernelStore is the kernel: maps are BPF maps pinned in a bpffs.
type KernelStore struct{}

var _ MapStore = KernelStore{}

// KernelMap is a kernel map as a [PinnedMap].
type KernelMap struct{ *ebpf.Map }

func (m KernelMap) MapID() (uint32, error) {
	info, err := m.Info()
	if err != nil {
		return 0, err
	}
	id, _ := info.ID()
	return uint32(id), nil
}

func (m KernelMap) Describe() string { return describeMap(m.Map) }

func (KernelStore) OpenPinned(log *slog.Logger, spec *ebpf.MapSpec, dir string) (PinnedMap, error) {
	m, err := OpenPinned(log, spec, dir)
	if err != nil {
		return nil, err
	}
	return KernelMap{m}, nil
}

func (KernelStore) LoadPinned(path string) (PinnedMap, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, err
	}
	return KernelMap{m}, nil
}

func (KernelStore) Create(spec *ebpf.MapSpec) (PinnedMap, error) {
	m, err := NewUnpinnedMap(spec)
	if err != nil {
		return nil, err
	}
	return KernelMap{m}, nil
}

func (KernelStore) Pin(pm PinnedMap, path string) error {
	m, ok := pm.(KernelMap)
	if !ok {
		return fmt.Errorf("pin %s: %T is not a kernel map", path, pm)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("pin at %s: %w", path, err)
	}
	// Remove whatever is at the path (another map's pin included), and
	// forget the map's own pin path (Pin to the same path is a no-op).
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the pin at %s: %w", path, err)
	}
	if err := m.Map.Unpin(); err != nil {
		return fmt.Errorf("unpin before pinning at %s: %w", path, err)
	}
	if err := m.Map.Pin(path); err != nil {
		return fmt.Errorf("pin at %s (is a bpffs mounted at the bpf root?): %w", path, err)
	}
	return nil
}

func (KernelStore) Unpin(path string) error { return os.Remove(path) }

// KernelMaps returns the kernel maps of maps, by name, and whether there
// are some and every map is one: the BPF programs (masquerade decision,
// policy verdict) run on kernel maps only; on fakes (or no maps at all)
// their Go models decide.
func KernelMaps[M PinnedMap](maps map[string]M) (map[string]*ebpf.Map, bool) {
	out := make(map[string]*ebpf.Map, len(maps))
	for name, m := range maps {
		k, ok := any(m).(KernelMap)
		if !ok {
			return nil, false
		}
		out[name] = k.Map
	}
	return out, len(out) > 0
}

// LookupMap is a map the listings read: keys and values. *ebpf.Map, the
// [PinnedMap]s and bpffake.FakeMap are.
type LookupMap interface {
	Map
	Lookup(key, valueOut any) error
}

// IsNil says whether m is nil or a nil pointer in an interface (a missing
// map in a map of maps).
func IsNil(m Map) bool {
	if k, ok := m.(KernelMap); ok {
		return k.Map == nil
	}
	v := reflect.ValueOf(m)
	return !v.IsValid() || v.Kind() == reflect.Pointer && v.IsNil()
}
