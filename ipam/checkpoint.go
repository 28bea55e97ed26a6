package ipam

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// CheckpointFile is the name of the allocations checkpoint in the state dir.
const CheckpointFile = "ipam-allocations.json"

const checkpointVersion = 1

// checkpoint is the file format:
//
//	{"version": 1, "allocations": [{"ip": "10.130.100.133", "owner": "shop/web"}]}
type checkpoint struct {
	Version     int               `json:"version"`
	Allocations []CheckpointEntry `json:"allocations"`
}

// CheckpointEntry is one allocation as checkpointed: the ENI and the state
// are recomputed from the CiliumNode at restore.
type CheckpointEntry struct {
	IP    netip.Addr `json:"ip"`
	Owner string     `json:"owner"`
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
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c checkpoint
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%s: not an allocations checkpoint: %w", path, err)
	}
	if c.Version != checkpointVersion {
		return nil, fmt.Errorf("%s: version %d, this agent reads version %d", path, c.Version, checkpointVersion)
	}
	seen := map[netip.Addr]bool{}
	for i, e := range c.Allocations {
		if !e.IP.IsValid() {
			return nil, fmt.Errorf("%s: allocations[%d]: no ip", path, i)
		}
		if err := validateOwner(e.Owner); err != nil {
			return nil, fmt.Errorf("%s: allocations[%d]: %w", path, i, err)
		}
		if ip := e.IP.Unmap(); seen[ip] {
			return nil, fmt.Errorf("%s: allocations[%d]: %s is listed twice", path, i, e.IP)
		} else {
			seen[ip] = true
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
	data, err := json.MarshalIndent(checkpoint{Version: checkpointVersion, Allocations: entries}, "", "  ")
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
