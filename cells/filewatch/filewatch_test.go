package filewatch

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// watch runs WatchDir on dir and returns a channel that receives a value per
// reload (the first one at start).
func watch(t *testing.T, dir string) <-chan struct{} {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	reloads := make(chan struct{}, 100)
	done := make(chan error)
	go func() {
		done <- WatchDir(ctx, slog.New(slog.DiscardHandler), dir, time.Hour, func() { reloads <- struct{}{} })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchDir: %s", err)
		}
	})
	expectReload(t, reloads, "start")
	return reloads
}

func expectReload(t *testing.T, reloads <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-reloads:
	case <-time.After(10 * time.Second):
		t.Fatalf("no reload after %s", what)
	}
}

func TestWatchDirSeesADirectoryThatAppearsLater(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b", "config")
	reloads := watch(t, dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	expectReload(t, reloads, "the directory appeared")
	// Now the directory itself is watched: a file written in it is seen.
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	expectReload(t, reloads, "a file was written")
}

func TestWatchDirSeesAConfigMapSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	for _, step := range [][2]string{{"..2026_a", ""}, {"..2026_b", ""}} {
		if err := os.Mkdir(filepath.Join(dir, step[0]), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("..2026_a", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	reloads := watch(t, dir)
	if err := os.Symlink("..2026_b", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	expectReload(t, reloads, "the ..data swap")
}

func TestWatchDirRewatchesARecreatedDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "config")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	reloads := watch(t, dir)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	expectReload(t, reloads, "the directory was removed")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	expectReload(t, reloads, "the directory was recreated")
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	expectReload(t, reloads, "a file was written in the new directory")
}
