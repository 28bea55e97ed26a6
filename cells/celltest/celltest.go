// Package celltest runs script tests (txtar files) against enimasq cells, the
// way cilium/statedb and cilium/hive test theirs: a hive of the cells under
// test plus the agent's core infrastructure, driven by `hive start`, `db/...`
// commands, `health` and the cells' own script commands.
//
// Each script gets a fresh state dir and, when running as root, a private
// bpffs mount as --bpf-root. A `#! --flag=value` first line sets flags.
package celltest

import (
	"bytes"
	"context"
	"flag"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"golang.org/x/tools/txtar"

	"github.com/enimasq/enimasq/cells/infra"
)

// Run runs the scripts matching pattern (e.g. "testdata/*.txtar"), in
// parallel, each with a new hive of infra.Core, the node config and the given
// cells. In the #! line, $WORK is the script's work dir. $BPFROOT is the
// script's private bpffs (the --bpf-root).
func Run(t *testing.T, pattern string, newCells func(t testing.TB) []cell.Cell) {
	run(t, pattern, PrivateBPFFS, newCells)
}

// RunWithoutBPFFS is Run with a plain directory as $BPFROOT, for cells
// whose maps are fakes (bpffake.FakeStore marks its pins with files there).
func RunWithoutBPFFS(t *testing.T, pattern string, newCells func(t testing.TB) []cell.Cell) {
	run(t, pattern, func(t testing.TB) string { return t.TempDir() }, newCells)
}

func run(t *testing.T, pattern string, bpfRootDir func(testing.TB) string, newCells func(t testing.TB) []cell.Cell) {
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts match %s", pattern)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			t.Cleanup(cancel)

			archive, err := txtar.ParseFile(file)
			if err != nil {
				t.Fatal(err)
			}
			work := t.TempDir()
			bpfRoot := bpfRootDir(t)
			s, err := script.NewState(ctx, work, []string{"WORK=" + work, "TMPDIR=" + t.TempDir(), "BPFROOT=" + bpfRoot})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.ExtractFiles(archive); err != nil {
				t.Fatal(err)
			}
			args := []string{"--bpf-root=" + bpfRoot}
			if shebang, ok := strings.CutPrefix(string(archive.Comment), "#!"); ok {
				shebang, _, _ = strings.Cut(shebang, "\n")
				args = append(args, strings.Fields(strings.ReplaceAll(shebang, "$WORK", work))...)
			}
			RunScript(t, NewEngine(t, args, newCells(t)...), s, file, archive)
		})
	}
}

// RunScript runs one script (file, parsed as archive, its files extracted
// in s) on an engine. With -scripttest.update (the flag of hive's
// scripttest), the tables that db/cmp found are written into the file.
func RunScript(t *testing.T, e *script.Engine, s *script.State, file string, archive *txtar.Archive) {
	update := updating()
	s.DoUpdate = update
	scripttest.Run(t, e, s, file, bytes.NewReader(archive.Comment))
	if update {
		writeUpdates(t, file, archive, s.FileUpdates)
	}
}

// updating reports whether the test runs with -scripttest.update (the flag
// of hive's scripttest): db/cmp then writes the table it found into the
// script's file.
func updating() bool {
	f := flag.Lookup("scripttest.update")
	return f != nil && f.Value.String() == "true"
}

// writeUpdates writes the files that commands updated back into the script.
func writeUpdates(t *testing.T, file string, archive *txtar.Archive, updates map[string]string) {
	updated := false
	for i, f := range archive.Files {
		if data, ok := updates[f.Name]; ok {
			archive.Files[i].Data = []byte(data)
			updated = true
		}
	}
	if !updated {
		return
	}
	if err := os.WriteFile(file, txtar.Format(archive), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("updated %s", file)
}

// NewEngine builds the script engine for one script.
func NewEngine(t testing.TB, args []string, extra ...cell.Cell) *script.Engine {
	log := hivetest.Logger(t, hivetest.LogLevel(slog.LevelDebug))
	h := infra.New(append([]cell.Cell{infra.Core, infra.NodeConfigCell}, extra...)...)

	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	if err := flags.Parse(args); err != nil {
		t.Fatalf("script flags %v: %s", args, err)
	}
	if !flags.Changed("state-dir") {
		flags.Set("state-dir", t.TempDir())
	}
	if !flags.Changed("bpf-root") {
		flags.Set("bpf-root", PrivateBPFFS(t))
	}

	cmds, err := h.ScriptCommands(log)
	if err != nil {
		t.Fatalf("ScriptCommands: %s", err)
	}
	maps.Insert(cmds, maps.All(script.DefaultCmds()))
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Errorf("hive stop: %s", err)
		}
	})
	return &script.Engine{Cmds: cmds, Quiet: !testing.Verbose()}
}

// PrivateBPFFS is a bpffs of t's own (MountBPFFS) when running as root, a
// plain temporary directory otherwise (the cells then run on fakes, or
// skip what needs the kernel).
func PrivateBPFFS(t testing.TB) string {
	if os.Geteuid() != 0 {
		return t.TempDir()
	}
	return MountBPFFS(t)
}

// MountBPFFS mounts a bpffs in a temporary directory for t, unmounted at
// cleanup; t is skipped unless it runs as root.
func MountBPFFS(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("bpffs", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs at %s: %s", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %s", dir, err)
		}
	})
	return dir
}

// RequireRoot skips a privileged test when not running as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("privileged test: needs root (bpffs, BPF maps, network namespaces)")
	}
}
