package bpf

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

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
// ([FakeStore]). The map features open their maps through it, check their
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
	m, err := newUnpinnedMap(spec)
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

// FakeStore is an in-memory [MapStore] of [FakeMap]s: pins are paths in a
// table, each marked by an empty file at its path (so that a pin can be
// seen, and removed, with the file system, as on a bpffs), IDs are counted.
// It behaves as the kernel does where the features look (a compatible
// pinned map is reused with its entries, an incompatible one replaced, a
// missing pin reported as not existing), so the script tests run on it
// without root.
type FakeStore struct {
	mu     sync.Mutex
	pins   map[string]*FakeMap
	nextID uint32
}

var _ MapStore = (*FakeStore)(nil)

// NewFakeStore returns an empty fake store.
func NewFakeStore() *FakeStore { return &FakeStore{pins: map[string]*FakeMap{}} }

func (s *FakeStore) newMap(spec *ebpf.MapSpec) *FakeMap {
	f := NewFakeMapFromSpec(spec)
	s.nextID++
	f.id = s.nextID
	return f
}

// pinned is the map pinned at path: in the table, and its file still there.
func (s *FakeStore) pinned(path string) *FakeMap {
	m := s.pins[path]
	if m == nil {
		return nil
	}
	if _, err := os.Stat(path); err != nil {
		delete(s.pins, path) // the pin was removed with the file system
		return nil
	}
	return m
}

// pin pins m at path, in the table and as a file.
func (s *FakeStore) pin(m *FakeMap, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("pin at %s: %w", path, err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return fmt.Errorf("pin at %s: %w", path, err)
	}
	for p, pinned := range s.pins {
		if pinned == m {
			delete(s.pins, p) // a map has one pin: pinning moves it
			os.Remove(p)
		}
	}
	s.pins[path] = m
	return nil
}

func (s *FakeStore) OpenPinned(log *slog.Logger, spec *ebpf.MapSpec, dir string) (PinnedMap, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	path := filepath.Join(dir, spec.Name)
	if old := s.pinned(path); old != nil {
		if old.compatible(spec) {
			return old, nil
		}
		log.Warn("Replacing incompatible pinned BPF map; its entries are dropped and reconciled again",
			"path", path, "pinned", old.Describe(), "wanted", describeSpec(spec))
	}
	m := s.newMap(spec)
	if err := s.pin(m, path); err != nil {
		return nil, err
	}
	return m, nil
}

func (s *FakeStore) LoadPinned(path string) (PinnedMap, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.pinned(path)
	if m == nil {
		return nil, &fs.PathError{Op: "load pinned map", Path: path, Err: os.ErrNotExist}
	}
	return m, nil
}

func (s *FakeStore) Create(spec *ebpf.MapSpec) (PinnedMap, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.newMap(spec), nil
}

func (s *FakeStore) Pin(pm PinnedMap, path string) error {
	m, ok := pm.(*FakeMap)
	if !ok {
		return fmt.Errorf("pin %s: %T is not a fake map", path, pm)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pins, path)
	return s.pin(m, path)
}

func (s *FakeStore) Unpin(path string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pinned(path) == nil {
		return &fs.PathError{Op: "unpin", Path: path, Err: os.ErrNotExist}
	}
	delete(s.pins, path)
	return os.Remove(path)
}

func (f *FakeMap) MapID() (uint32, error) { return f.id, nil }

func (f *FakeMap) Describe() string {
	typ := "LPMTrie"
	if f.spec != nil {
		typ = f.spec.Type.String()
	}
	return fmt.Sprintf("%s key=%d value=%d max=%d", typ, f.keySize, f.valueSize, f.maxEntries)
}

// compatible is the fake's spec.Compatible: sizes and type; flags are not
// modelled (BPF_F_RDONLY_PROG alone never makes a map incompatible).
func (f *FakeMap) compatible(spec *ebpf.MapSpec) bool {
	return uint32(f.keySize) == spec.KeySize && uint32(f.valueSize) == spec.ValueSize &&
		uint32(f.maxEntries) == spec.MaxEntries && (f.spec == nil || f.spec.Type == spec.Type)
}

// LookupMap is a map the listings read: keys and values. *ebpf.Map, the
// [PinnedMap]s and [FakeMap] are.
type LookupMap interface {
	Map
	Lookup(key, valueOut any) error
}

// IsNil says whether m is nil or a nil pointer in an interface (a missing
// map in a map of maps).
func IsNil(m Map) bool {
	switch v := m.(type) {
	case nil:
		return true
	case *ebpf.Map:
		return v == nil
	case *FakeMap:
		return v == nil
	case KernelMap:
		return v.Map == nil
	}
	return false
}
