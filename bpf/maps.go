package bpf

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Names and size of the masquerade-exemption maps, as Cilium pins them.
const (
	IPMasqV4MapName    = "cilium_ipmasq_v4"
	IPMasqV6MapName    = "cilium_ipmasq_v6"
	IPMasqMaxEntries   = 16384
	ipMasqValueSize    = 1 // u8, always 1
	ipMasqValuePresent = 1
)

// IPMasqValue is the value of every entry of the masquerade-exemption maps.
func IPMasqValue() []byte { return []byte{ipMasqValuePresent} }

// LPMSpec describes an LPM-trie map. LPM tries must not be preallocated, so
// the spec always carries BPF_F_NO_PREALLOC.
func LPMSpec(name string, keySize, valueSize, maxEntries uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       name,
		Type:       ebpf.LPMTrie,
		KeySize:    keySize,
		ValueSize:  valueSize,
		MaxEntries: maxEntries,
		Flags:      unix.BPF_F_NO_PREALLOC,
	}
}

// IPMasqV4Spec describes cilium_ipmasq_v4: IPv4 LPM keys, u8 values.
func IPMasqV4Spec() *ebpf.MapSpec {
	return ipMasqSpec(IPMasqV4MapName, KeySizeV4)
}

// IPMasqV6Spec describes cilium_ipmasq_v6: IPv6 LPM keys, u8 values.
func IPMasqV6Spec() *ebpf.MapSpec {
	return ipMasqSpec(IPMasqV6MapName, KeySizeV6)
}

// ipMasqSpec is Cilium v1.20.2's spec of the ipmasq maps
// (pkg/maps/ipmasq, bpf/lib/nat.h): programs only read them
// (BPF_F_RDONLY_PROG). The flags must be Cilium's exactly: in the Cilium
// build, Cilium's ip-masq-maps cell creates the maps before enimasq opens
// them, and a map of another spec is replaced by either side.
func ipMasqSpec(name string, keySize uint32) *ebpf.MapSpec {
	spec := LPMSpec(name, keySize, ipMasqValueSize, IPMasqMaxEntries)
	spec.Flags |= unix.BPF_F_RDONLY_PROG
	return spec
}

// GlobalsDir is the directory where Cilium pins its global maps under the
// bpffs root, e.g. /sys/fs/bpf/tc/globals.
func GlobalsDir(bpfRoot string) string {
	return filepath.Join(bpfRoot, "tc", "globals")
}

// OpenPinned returns the map of spec pinned at dir/spec.Name.
//
// The directory is created (0700) if missing. A pinned map whose type, key
// size, value size, max entries and flags match spec is reused with its
// contents. A pinned map that does not match is replaced by a new empty map,
// with a warning naming both; the reconciler refills it. When nothing is
// pinned, a new map is created and pinned. Anything else at the path (not a
// map, unreadable) is an error and is left alone.
func OpenPinned(log *slog.Logger, spec *ebpf.MapSpec, dir string) (*ebpf.Map, error) {
	if spec.Name == "" {
		return nil, errors.New("open pinned map: spec has no name")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open pinned map %s: %w", spec.Name, err)
	}
	path := filepath.Join(dir, spec.Name)

	old, err := ebpf.LoadPinnedMap(path, nil)
	switch {
	case errors.Is(err, os.ErrNotExist):
		old = nil
	case err != nil:
		return nil, fmt.Errorf("load pinned map %s: %w", path, err)
	default:
		err := spec.Compatible(old)
		if err == nil || onlyReadOnlyProgDiffers(spec, old) {
			return old, nil
		}
		if !errors.Is(err, ebpf.ErrMapIncompatible) {
			old.Close()
			return nil, fmt.Errorf("check pinned map %s: %w", path, err)
		}
		if onlySizeDiffers(spec, old) {
			return resize(log, spec, old, path)
		}
		log.Warn("Replacing incompatible pinned BPF map; its entries are dropped and reconciled again",
			"path", path,
			"pinned", describeMap(old),
			"wanted", DescribeSpec(spec),
			"reason", err)
	}

	m, err := NewUnpinnedMap(spec)
	if err != nil {
		if old != nil {
			old.Close()
		}
		return nil, err
	}
	// The new map exists before the old pin goes away, so a failure to create
	// it leaves the old pin in place. Between Unpin and Pin the path is empty
	// for a moment, and programs already loaded keep the old map: replacing
	// is for a spec change at upgrade, before the datapath uses the map.
	if old != nil {
		err := old.Unpin()
		old.Close()
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("unpin incompatible map %s: %w", path, err)
		}
	}
	if err := m.Pin(path); err != nil {
		m.Close()
		return nil, fmt.Errorf("pin map %s: %w", path, err)
	}
	return m, nil
}

// onlySizeDiffers says whether the pinned map matches spec but for its
// max entries: the same layout, so its entries are valid in a map of spec.
func onlySizeDiffers(spec *ebpf.MapSpec, m *ebpf.Map) bool {
	if m.MaxEntries() == spec.MaxEntries {
		return false
	}
	relaxed := spec.Copy()
	relaxed.MaxEntries = m.MaxEntries()
	return relaxed.Compatible(m) == nil
}

// resize replaces the pinned map old by a map of spec that holds every entry
// of old, copied before the pin moves: a map that is only resized
// (--policy-map-max-entries changed, what the docs advise on a full map)
// keeps its content, so the versions in force and the programs bound to it
// never meet a map that lacks their keys. A map too small for what old
// holds is not made: old is kept, with a warning, and the resize waits for
// a restart with room.
func resize(log *slog.Logger, spec *ebpf.MapSpec, old *ebpf.Map, path string) (*ebpf.Map, error) {
	entries, err := Entries(KernelMap{old})
	if err != nil {
		old.Close()
		return nil, fmt.Errorf("resize pinned map %s: read its entries: %w", path, err)
	}
	if len(entries) > int(spec.MaxEntries) {
		log.Warn("Pinned BPF map holds more entries than its new size: kept at its old size",
			"path", path, "entries", len(entries), "pinned", describeMap(old), "wanted", DescribeSpec(spec))
		return old, nil
	}
	m, err := NewUnpinnedMap(spec)
	if err != nil {
		old.Close()
		return nil, err
	}
	fail := func(err error) (*ebpf.Map, error) {
		m.Close()
		old.Close()
		return nil, fmt.Errorf("resize pinned map %s: %w", path, err)
	}
	for _, e := range entries {
		if err := m.Put(e.Key, e.Value); err != nil {
			return fail(fmt.Errorf("copy key %x: %w", e.Key, err))
		}
	}
	// rename(2) in a bpffs replaces the pin in one step: the path never
	// names no map, nor one without the entries.
	tmp := path + "_resizing" // bpffs names have no dot
	os.Remove(tmp)
	if err := m.Pin(tmp); err != nil {
		return fail(fmt.Errorf("pin %s: %w", tmp, err))
	}
	if err := os.Rename(tmp, path); err != nil {
		m.Unpin()
		return fail(fmt.Errorf("rename %s: %w", tmp, err))
	}
	log.Info("Resized pinned BPF map: its entries copied into the new one",
		"path", path, "entries", len(entries), "from", describeMap(old), "to", DescribeSpec(spec))
	old.Close()
	// A handle that knows its pin's path (m's names the temporary one).
	pinned, err := ebpf.LoadPinnedMap(path, nil)
	m.Close()
	if err != nil {
		return nil, fmt.Errorf("resize pinned map %s: open it again: %w", path, err)
	}
	return pinned, nil
}

// onlyReadOnlyProgDiffers says whether the pinned map matches spec but for
// BPF_F_RDONLY_PROG, which only restricts programs. Such a map is reused, as
// Cilium's OpenOrCreateMap does: replacing it would leave a datapath already
// loaded on the old map, and Cilium may have created (or reused) it first.
func onlyReadOnlyProgDiffers(spec *ebpf.MapSpec, m *ebpf.Map) bool {
	info, err := m.Info()
	if err != nil || (info.Flags^spec.Flags) != unix.BPF_F_RDONLY_PROG {
		return false
	}
	relaxed := spec.Copy()
	relaxed.Flags = info.Flags
	return relaxed.Compatible(m) == nil
}

// NewUnpinnedMap creates a map of spec without its pinning: a map of this
// process only, gone when its last reference is.
func NewUnpinnedMap(spec *ebpf.MapSpec) (*ebpf.Map, error) {
	spec = spec.Copy()
	spec.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("create map %s: %w", spec.Name, err)
	}
	return m, nil
}

// DescribeSpec is how a map of spec is described in logs and errors, as a
// pinned map's Describe says it.
func DescribeSpec(s *ebpf.MapSpec) string {
	return fmt.Sprintf("%s key=%d value=%d max=%d flags=%#x",
		s.Type, s.KeySize, s.ValueSize, s.MaxEntries, s.Flags)
}

func describeMap(m *ebpf.Map) string {
	return fmt.Sprintf("%s key=%d value=%d max=%d flags=%#x",
		m.Type(), m.KeySize(), m.ValueSize(), m.MaxEntries(), m.Flags())
}
