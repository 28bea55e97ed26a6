package allocator

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCheckpointRoundTripAndAtomicWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, CheckpointFile)

	if got, err := ReadCheckpoint(path); err != nil || got != nil {
		t.Fatalf("missing checkpoint: %v %v, want no allocations", got, err)
	}
	entries := []CheckpointEntry{
		{IP: netip.MustParseAddr("10.130.112.20"), Owner: "shop/b", PodUID: "6c1e4bd0-0f5a-4d5b-9a55-7a6b1e0d9c01", ContainerID: "ctr-b", IfName: "eth0"},
		{IP: netip.MustParseAddr("10.130.100.133"), Owner: "shop/a"},
	}
	if err := WriteCheckpoint(path, entries); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []CheckpointEntry{entries[1], entries[0]} // sorted by IP
	if !slices.Equal(got, want) {
		t.Errorf("read back %v, want %v", got, want)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("checkpoint mode %v %v, want 0600", fi.Mode(), err)
	}

	// A temporary file left by a crash in the middle of a write is ignored
	// by the reader and removed at restore.
	stale := filepath.Join(dir, tempPrefix(path)+"123")
	os.WriteFile(stale, []byte(`{"version": 1, "allocations": [{"ip": "10.`), 0o600)
	if got, err := ReadCheckpoint(path); err != nil || len(got) != 2 {
		t.Errorf("with a stale temp file: %v %v", got, err)
	}
	removeStaleTemps(path)
	files, _ := os.ReadDir(dir)
	if len(files) != 1 || files[0].Name() != CheckpointFile {
		t.Errorf("files after removeStaleTemps: %v", files)
	}

	if err := WriteCheckpoint(path, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadCheckpoint(path); err != nil || len(got) != 0 {
		t.Errorf("empty checkpoint: %v %v", got, err)
	}
}

func TestCheckpointRejectsBadFiles(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ content, want string }{
		{`{"version": 1, "allocations": [{"ip": "10.0.0.1", "owner": "a/b"}`, "not an allocations checkpoint"},
		{`{"version": 4, "allocations": []}`, "version 4, this agent reads versions 1 to 3"},
		{`{"version": 2, "allocations": [{"ip": "10.0.0.1", "owner": "a/b", "network": "n", "containerID": "c", "ifname": "eth0"}]}`, "version 2 has no network"},
		{`{"version": 3, "allocations": [{"ip": "10.0.0.1", "owner": "a/b", "network": "-n", "containerID": "c", "ifname": "eth0"}]}`, "network"},
		{`{"version": 2, "allocations": [{"ip": "10.0.0.1", "owner": "A/b", "containerID": "c", "ifname": "eth0"}]}`, "namespace"},
		{`{"version": 2, "allocations": [{"ip": "10.0.0.1", "owner": "a/b", "ifname": "eth0"}]}`, "without a containerID"},
		{`{"version": 2, "allocations": [{"ip": "10.0.0.1", "owner": "a/b", "containerID": "c/d", "ifname": "eth0"}]}`, "containerID"},
		{`{"version": 1, "allocations": [{"ip": "10.0.0.1", "owner": "a/b", "containerID": "c", "ifname": "eth0"}]}`, "version 1 has no attachment"},
		{`{"version": 1, "allocations": [{"ip": "10.0.0.1", "owner": "nobody"}]}`, "NAMESPACE/POD"},
		{`{"version": 1, "allocations": [{"owner": "a/b"}]}`, "no ip"},
		{`{"version": 1, "allocations": [{"ip": "10.0.0.1", "owner": "a/b"}, {"ip": "10.0.0.1", "owner": "a/c"}]}`, "listed twice"},
		{`{"version": 1, "allocations": [], "extra": 1}`, "unknown field"},
	} {
		path := filepath.Join(dir, CheckpointFile)
		os.WriteFile(path, []byte(tc.content), 0o600)
		_, err := ReadCheckpoint(path)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.content, err, tc.want)
		}
	}
}

// TestCheckpointVersion1IsMigrated: a checkpoint written before attachments
// (version 1, owners checked by the old rule) is read, its allocations
// without attachment and marked V1 (their pods' DEL releases them, an API
// allocation's never); the next write is version 3, the mark kept.
func TestCheckpointVersion1IsMigrated(t *testing.T) {
	path := filepath.Join(t.TempDir(), CheckpointFile)
	os.WriteFile(path, []byte(`{"version": 1, "allocations": [{"ip": "10.0.0.1", "owner": "shop/db-0"}, {"ip": "10.0.0.2", "owner": "cni/ABC_1"}]}`), 0o600)
	got, err := ReadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []CheckpointEntry{{IP: netip.MustParseAddr("10.0.0.1"), Owner: "shop/db-0", V1: true}, {IP: netip.MustParseAddr("10.0.0.2"), Owner: "cni/ABC_1", V1: true}}
	if !slices.Equal(got, want) {
		t.Fatalf("read %v, want %v", got, want)
	}
	if err := WriteCheckpoint(path, got); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(path); !strings.Contains(string(data), `"version": 3`) {
		t.Errorf("rewritten as:\n%s", data)
	}
	if again, err := ReadCheckpoint(path); err != nil || !slices.Equal(again, want) {
		t.Errorf("the migrated checkpoint reads back as %v, %v", again, err)
	}
}

// A checkpoint is one JSON value: a second one after it (its allocations
// would be dropped and their IPs handed out again), an unknown or a
// duplicate field is refused, naming the file.
func TestCheckpointIsStrict(t *testing.T) {
	path := filepath.Join(t.TempDir(), CheckpointFile)
	for _, tc := range []struct{ name, data, want string }{
		{"trailing value", `{"version":2,"allocations":[]} {"version":2,"allocations":[{"ip":"10.0.1.5","owner":"shop/a"}]}`, "data after the first value"},
		{"duplicate field", `{"version":2,"allocations":[],"allocations":[]}`, "field allocations is given twice"},
		{"unknown field", `{"version":2,"allocations":[],"allocs":[]}`, "unknown field"},
	} {
		if err := os.WriteFile(path, []byte(tc.data), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadCheckpoint(path)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, %v; want an error naming %s and saying %q", tc.name, got, err, path, tc.want)
		}
	}
}

// Whatever damage a checkpoint takes (bytes changed, lost, added, the file
// cut short), it is refused or read as it was written: never as fewer or
// other allocations, whose IPs would go to new pods while their attachments
// run.
func TestCheckpointDamageNeverLosesAnAllocation(t *testing.T) {
	path := filepath.Join(t.TempDir(), CheckpointFile)
	var entries []CheckpointEntry
	for i := range 12 {
		e := CheckpointEntry{IP: netip.AddrFrom4([4]byte{10, 130, 100, byte(133 + i)}), Owner: fmt.Sprintf("shop/pod-%d", i)}
		switch i % 3 {
		case 0:
			e.Network, e.ContainerID, e.IfName, e.PodUID = "enimasq", fmt.Sprintf("ctr%d", i), "eth0", "6c1e4bd0-0f5a-4d5b-9a55-7a6b1e0d9c01"
		case 1:
			e.V1 = true
		}
		entries = append(entries, e)
	}
	if err := WriteCheckpoint(path, entries); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ReadCheckpoint(path)
	if err != nil || len(want) != len(entries) {
		t.Fatalf("the written checkpoint reads as %v, %v", want, err)
	}

	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 1))
	accepted := 0
	for round := range 5000 {
		data := slices.Clone(good)
		for range 1 + rng.IntN(3) {
			if len(data) == 0 {
				break
			}
			i := rng.IntN(len(data))
			switch rng.IntN(4) {
			case 0: // a byte changed, to a character of JSON's sort
				data[i] = "0123456789abcdef.:,\"{}[] \n"[rng.IntN(26)]
			case 1: // a byte lost
				data = slices.Delete(data, i, i+1)
			case 2: // a byte added
				data = slices.Insert(data, i, "0123456789.:,\" "[rng.IntN(15)])
			case 3: // cut short
				data = data[:i]
			}
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadCheckpoint(path)
		if err != nil {
			continue
		}
		accepted++
		if !slices.Equal(got, want) {
			t.Fatalf("seed %d, round %d: the damaged checkpoint\n%s\nreads as %v\nwant the written %v or an error", seed, round, data, got, want)
		}
	}
	t.Logf("seed %d: %d of 5000 damaged checkpoints read (as written: whitespace only), the rest refused", seed, accepted)
}
