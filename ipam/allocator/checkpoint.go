package allocator

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/enimasq/enimasq/cells/strictdecode"
	"github.com/enimasq/enimasq/ipam/allocations"
)

// CheckpointFile is the name of the allocations checkpoint in the state dir.
const CheckpointFile = "ipam-allocations.json"

// checkpointVersion is the version written. Version 3 added the
// attachment's network name; version 2 the attachment (containerID,
// ifname) and the pod UID of each allocation. Older files are read and
// migrated, and the next write is version 3: a version-2 attachment has no
// network (its DEL, in whatever network, releases it; a GC leaves it); a
// version-1 allocation has no attachment, so it belongs to its owner (a DEL
// of the owner without an allocation of its own attachment releases it, GC
// leaves it).
const checkpointVersion = 3

// checkpoint is the file format:
//
//	{"version": 3, "allocations": [{"ip": "10.130.100.133", "owner": "shop/web",
//	  "podUID": "...", "network": "enimasq", "containerID": "...", "ifname": "eth0"}]}
type checkpoint struct {
	Version int `json:"version"`
	// SHA256 (version 3) is the hex SHA-256 of the allocations as JSON
	// (json.Marshal of the list): a file damaged anywhere, also into
	// another valid checkpoint (a digit of an IP changed), is refused
	// rather than read as fewer or other allocations, whose IPs would be
	// handed out again.
	SHA256      string            `json:"sha256,omitempty"`
	Allocations []CheckpointEntry `json:"allocations"`
}

// allocationsSum is checkpoint.SHA256 of entries.
func allocationsSum(entries []CheckpointEntry) (string, error) {
	if entries == nil {
		entries = []CheckpointEntry{}
	}
	data, err := json.Marshal(entries)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// CheckpointEntry is one allocation as checkpointed: the ENI and the state
// are recomputed from the CiliumNode at restore.
type CheckpointEntry struct {
	IP          netip.Addr `json:"ip"`
	Owner       string     `json:"owner"`
	PodUID      string     `json:"podUID,omitempty"`
	Network     string     `json:"network,omitempty"`
	ContainerID string     `json:"containerID,omitempty"`
	IfName      string     `json:"ifname,omitempty"`
	// V1 marks an allocation migrated from a version-1 checkpoint.
	V1 bool `json:"v1,omitempty"`
}

func (e CheckpointEntry) attachment() allocations.Attachment {
	return allocations.Attachment{Network: e.Network, ContainerID: e.ContainerID, IfName: e.IfName}
}

// ReadCheckpoint reads the checkpoint. A missing file is no allocations.
func ReadCheckpoint(path string) ([]CheckpointEntry, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// Strict, as every input: an unknown or duplicate field, a value of
	// the wrong type or anything after the one JSON value is refused (a
	// second value's allocations would be dropped and their IPs handed
	// out again).
	var c checkpoint
	if err := (strictdecode.Decoder{}).DecodeJSON(data, &c); err != nil {
		return nil, fmt.Errorf("%s: not an allocations checkpoint: %w", path, err)
	}
	switch c.Version {
	case checkpointVersion: // its sum is checked below, once its entries are
	case 2:
		if c.SHA256 != "" {
			return nil, fmt.Errorf("%s: version 2 has no sha256", path)
		}
		for i, e := range c.Allocations {
			if e.Network != "" || e.V1 {
				return nil, fmt.Errorf("%s: allocations[%d]: version 2 has no network and no v1 mark", path, i)
			}
		}
	case 1:
		if c.SHA256 != "" {
			return nil, fmt.Errorf("%s: version 1 has no sha256", path)
		}
		for i, e := range c.Allocations {
			if !e.attachment().IsZero() || e.PodUID != "" || e.V1 {
				return nil, fmt.Errorf("%s: allocations[%d]: version 1 has no attachment", path, i)
			}
			c.Allocations[i].V1 = true
		}
	default:
		return nil, fmt.Errorf("%s: version %d, this agent reads versions 1 to %d", path, c.Version, checkpointVersion)
	}
	seen := map[netip.Addr]bool{}
	for i, e := range c.Allocations {
		if !e.IP.IsValid() {
			return nil, fmt.Errorf("%s: allocations[%d]: no ip", path, i)
		}
		// Owners of allocations without attachment may come from version 1,
		// whose owners were checked by the older rule.
		validOwner := validateOwner
		if e.attachment().IsZero() {
			validOwner = validateLegacyOwner
		}
		if err := validOwner(e.Owner); err != nil {
			return nil, fmt.Errorf("%s: allocations[%d]: %w", path, i, err)
		}
		if err := validateAttachment(e.attachment()); err != nil {
			return nil, fmt.Errorf("%s: allocations[%d]: %w", path, i, err)
		}
		if ip := e.IP.Unmap(); seen[ip] {
			return nil, fmt.Errorf("%s: allocations[%d]: %s is listed twice", path, i, e.IP)
		} else {
			seen[ip] = true
		}
	}
	if c.Version == checkpointVersion {
		sum, err := allocationsSum(c.Allocations)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if c.SHA256 != sum {
			return nil, fmt.Errorf("%s: sha256 %q does not match its allocations (%s): the file is damaged", path, c.SHA256, sum)
		}
	}
	return c.Allocations, nil
}

// WriteCheckpoint replaces the checkpoint atomically: a temporary file in
// the same directory, synced, renamed over the old one, and the directory
// synced. A crash at any point leaves the old or the new file, never a mix.
func WriteCheckpoint(path string, entries []CheckpointEntry) error {
	entries = slices.Clone(entries)
	slices.SortFunc(entries, func(a, b CheckpointEntry) int { return a.IP.Compare(b.IP) })
	if entries == nil {
		entries = []CheckpointEntry{}
	}
	sum, err := allocationsSum(entries)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(checkpoint{Version: checkpointVersion, SHA256: sum, Allocations: entries}, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')

	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, tempPrefix(path)+"*")
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	done = true
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

func tempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// removeStaleTemps deletes temporary files left by a crash during a write.
func removeStaleTemps(path string) {
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix(path)) {
			os.Remove(filepath.Join(filepath.Dir(path), e.Name()))
		}
	}
}
