package compile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
)

// Upgrading a node from the release before versions.
//
// That release's policy maps have keys without a version ({prefixlen =
// pod bits + peer bits; pod; peer}, 12 or 36 bytes) and no versions map;
// its values and chunks are today's. Opened as they are, the maps are of
// another layout and would be replaced by empty ones: the programs this
// run loads would meet pods without a versions entry (no policy) until
// their first versions are written, and a deny-all pod would be open for
// that long. So, before any map is opened, such maps are migrated: each is
// copied into a map of today's layout with every key at version
// migratedVersion, the versions map is made with every pod that has keys
// at that version in its tier (and the version recorded as handed out),
// and only then do the pins move, one rename each (the programs that
// release left on the devices keep its maps until this run loads its own).
// The run then takes the versions over as it does after any restart
// (adopt.go): nothing is written anew where the inputs did not change.
//
// The versions map is made only on a node without one (one that ran the
// release before versions last); maps of that release found beside a
// versions map (a migration that stopped midway) are migrated without it.
// Any other map of another layout is replaced by an empty one
// (bpf.OpenPinned), and the program closes a pod whose version has no key
// in it.

// migratedVersion is the version of the migrated keys.
const migratedVersion uint32 = 1

// registerMigration migrates, at start and before the maps are opened,
// the maps of the release before versions.
func registerMigration(c registration) {
	if c.Settings.Off != "" {
		return
	}
	c.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			return migrateVersionless(c.Log, c.Node.GlobalsDir(), policyMapFamilies(c.Node), c.Settings.MaxEntries)
		},
	})
}

// versionlessMap is a pinned map of the release before versions and its
// entries in today's layout.
type versionlessMap struct {
	spec    *ebpf.MapSpec
	entries []bpf.KeyValue
}

func migrateVersionless(log *slog.Logger, dir string, families []bpf.Family, maxEntries uint32) error {
	versionsSpec, err := versionsMapSpec()
	if err != nil {
		return err
	}
	// A node with a versions map is of this release, or one whose
	// migration stopped midway (after the versions map, which goes
	// first): maps of the release before are migrated all the same, and
	// the versions map is left as it is.
	_, err = os.Stat(filepath.Join(dir, versionsSpec.Name))
	haveVersions := !errors.Is(err, os.ErrNotExist)
	var found []versionlessMap
	pods := map[netip.Addr]*[len(tiers)]uint32{}
	keys := 0
	for i, names := range [len(tiers)]func(policybpf.Direction, bpf.Family) *ebpf.MapSpec{
		func(d policybpf.Direction, f bpf.Family) *ebpf.MapSpec { return policyKind{}.mapSpec(d, f, maxEntries) },
		func(d policybpf.Direction, f bpf.Family) *ebpf.MapSpec {
			return clusterKind{}.mapSpec(d, f, maxEntries)
		},
	} {
		for _, f := range families {
			for _, d := range []policybpf.Direction{policybpf.Egress, policybpf.Ingress} {
				spec := names(d, f)
				m, err := readVersionless(spec, filepath.Join(dir, spec.Name), f, pods, i)
				if err != nil {
					log.Warn("Cannot migrate a policy map of the release before versions: it is replaced by an empty one",
						"map", spec.Name, "error", err)
					continue
				}
				if m != nil {
					found = append(found, *m)
					keys += len(m.entries)
				}
			}
		}
	}
	if len(found) == 0 {
		return nil
	}
	if haveVersions {
		for _, m := range found {
			if err := replaceWith(m, filepath.Join(dir, m.spec.Name)); err != nil {
				return fmt.Errorf("migrate %s: %w", m.spec.Name, err)
			}
		}
		log.Info("Migrated the policy maps of the release before versions left by a migration that stopped midway",
			"maps", len(found), "keys", keys, "version", migratedVersion)
		return nil
	}
	// The versions first: pinned before any migrated map, so that a
	// program loaded meanwhile never finds keys at a version no pod has
	// (a pod whose keys are in a map that could not be migrated is at
	// that version without them: closed in that direction, never open,
	// until this run writes its policy).
	versions, err := bpf.NewUnpinnedMap(versionsSpec)
	if err != nil {
		return err
	}
	defer versions.Close()
	if err := versions.Put(policybpf.PolicyVersionsHighWaterKey(), policybpf.EncodePolicyVersions(migratedVersion, 0)); err != nil {
		return fmt.Errorf("migrate: versions high-water mark: %w", err)
	}
	for pod, vs := range pods {
		if err := versions.Put(policybpf.PolicyPodKey(pod), policybpf.EncodePolicyVersions(vs[0], vs[1])); err != nil {
			return fmt.Errorf("migrate: versions of %s: %w", pod, err)
		}
	}
	if err := versions.Pin(filepath.Join(dir, versionsSpec.Name)); err != nil {
		return fmt.Errorf("migrate: pin %s: %w", versionsSpec.Name, err)
	}
	for _, m := range found {
		if err := replaceWith(m, filepath.Join(dir, m.spec.Name)); err != nil {
			return fmt.Errorf("migrate %s: %w", m.spec.Name, err)
		}
	}
	log.Info("Migrated the policy maps of the release before versions",
		"maps", len(found), "pods", len(pods), "keys", keys, "version", migratedVersion)
	return nil
}

// readVersionless reads the map pinned at path if it is spec's map of the
// release before versions (its key 4 bytes shorter), converting its keys
// to spec's layout at migratedVersion and marking its pods' versions of
// tier; nil if nothing or another map is pinned there.
func readVersionless(spec *ebpf.MapSpec, path string, f bpf.Family, pods map[netip.Addr]*[len(tiers)]uint32, tier int) (*versionlessMap, error) {
	old, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer old.Close()
	if old.Type() != spec.Type || old.KeySize() != spec.KeySize-bpf.PolicyVersionSize ||
		old.ValueSize() != spec.ValueSize || old.Flags() != spec.Flags {
		return nil, nil
	}
	entries, err := bpf.Entries(bpf.KernelMap{Map: old})
	if err != nil {
		return nil, err
	}
	if len(entries) > int(spec.MaxEntries) {
		return nil, fmt.Errorf("%d entries, more than the %d of --policy-map-max-entries", len(entries), spec.MaxEntries)
	}
	addrLen := 4
	if f == bpf.IPv6 {
		addrLen = 16
	}
	out := &versionlessMap{spec: spec, entries: make([]bpf.KeyValue, 0, len(entries))}
	for _, e := range entries {
		if len(e.Key) != 4+2*addrLen {
			return nil, fmt.Errorf("key %x: %d bytes", e.Key, len(e.Key))
		}
		key := binary.NativeEndian.AppendUint32(nil, binary.NativeEndian.Uint32(e.Key)+8*bpf.PolicyVersionSize)
		key = append(key, e.Key[4:4+addrLen]...)
		key = binary.NativeEndian.AppendUint32(key, migratedVersion)
		key = append(key, e.Key[4+addrLen:]...)
		out.entries = append(out.entries, bpf.KeyValue{Key: key, Value: e.Value})
		pod, ok := netip.AddrFromSlice(e.Key[4 : 4+addrLen])
		if !ok {
			return nil, fmt.Errorf("key %x: no pod address", e.Key)
		}
		if pods[pod] == nil {
			pods[pod] = &[len(tiers)]uint32{}
		}
		pods[pod][tier] = migratedVersion
	}
	return out, nil
}

// replaceWith makes a map of m's spec holding its entries and moves the pin
// at path to it (pinned beside, renamed over: the path never names no map).
func replaceWith(m versionlessMap, path string) error {
	nm, err := bpf.NewUnpinnedMap(m.spec)
	if err != nil {
		return err
	}
	defer nm.Close()
	for _, e := range m.entries {
		if err := nm.Put(e.Key, e.Value); err != nil {
			return fmt.Errorf("key %x: %w", e.Key, err)
		}
	}
	tmp := path + "_migrating" // bpffs names have no dot
	os.Remove(tmp)
	if err := nm.Pin(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
