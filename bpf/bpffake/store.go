package bpffake

import (
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
)

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

var _ bpf.MapStore = (*FakeStore)(nil)

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

func (s *FakeStore) OpenPinned(log *slog.Logger, spec *ebpf.MapSpec, dir string) (bpf.PinnedMap, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	path := filepath.Join(dir, spec.Name)
	if old := s.pinned(path); old != nil {
		if old.compatible(spec) {
			return old, nil
		}
		log.Warn("Replacing incompatible pinned BPF map; its entries are dropped and reconciled again",
			"path", path, "pinned", old.Describe(), "wanted", bpf.DescribeSpec(spec))
	}
	m := s.newMap(spec)
	if err := s.pin(m, path); err != nil {
		return nil, err
	}
	return m, nil
}

func (s *FakeStore) LoadPinned(path string) (bpf.PinnedMap, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.pinned(path)
	if m == nil {
		return nil, &fs.PathError{Op: "load pinned map", Path: path, Err: os.ErrNotExist}
	}
	return m, nil
}

func (s *FakeStore) Create(spec *ebpf.MapSpec) (bpf.PinnedMap, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.newMap(spec), nil
}

func (s *FakeStore) Pin(pm bpf.PinnedMap, path string) error {
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
