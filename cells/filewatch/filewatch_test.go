package filewatch

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// watch runs WatchDir on dir and returns a channel that receives a value per
// reload (the first one at start).
func watch(t *testing.T, dir string) <-chan struct{} {
	t.Helper()
	return startWatch(t, func(ctx context.Context, reload func()) error {
		return WatchDir(ctx, slog.New(slog.DiscardHandler), dir, time.Hour, reload)
	}, func() struct{} { return struct{}{} })
}

// startWatch runs run until the test ends (its error fails the test) and
// returns a channel that receives what of each reload; it waits for the
// reload at start.
func startWatch[T any](t *testing.T, run func(ctx context.Context, reload func()) error, what func() T) <-chan T {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	reloads := make(chan T, 100)
	done := make(chan error)
	go func() {
		done <- run(ctx, func() { reloads <- what() })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watch: %s", err)
		}
	})
	next(t, reloads, "start")
	return reloads
}

// next is the next reload's value, failing the test after 10 s without one.
func next[T any](t *testing.T, reloads <-chan T, what string) T {
	t.Helper()
	select {
	case r := <-reloads:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("no reload after %s", what)
		var zero T
		return zero
	}
}

func TestWatchDirSeesADirectoryThatAppearsLater(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b", "config")
	reloads := watch(t, dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	next(t, reloads, "the directory appeared")
	// Now the directory itself is watched: a file written in it is seen.
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	next(t, reloads, "a file was written")
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
	next(t, reloads, "the ..data swap")
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
	next(t, reloads, "the directory was removed")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	next(t, reloads, "the directory was recreated")
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	next(t, reloads, "a file was written in the new directory")
}

// A rename into the directory and a symlink are read at once; a write, a
// close after writing and a new regular file are writes in place; a delete
// and a rename away wait for the burst to settle.
func TestClassify(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("x", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "file"), nil, 0o644)
	for _, tc := range []struct {
		name string
		mask uint32
		file string
		want int
	}{
		{"close-write", unix.IN_CLOSE_WRITE, "file", writeClosed},
		{"rename in", unix.IN_MOVED_TO, "file", readNow},
		{"symlink created", unix.IN_CREATE, "link", readNow},
		{"regular file created", unix.IN_CREATE, "file", written},
		{"write or truncation", unix.IN_MODIFY, "file", written},
		{"delete", unix.IN_DELETE, "file", readLater},
		{"rename away", unix.IN_MOVED_FROM, "file", readLater},
		{"chmod", unix.IN_ATTRIB, "file", readLater},
		{"directory created", unix.IN_CREATE | unix.IN_ISDIR, "d", readLater},
	} {
		if got := classify(event{wd: 1, mask: tc.mask, name: tc.file}, 1, dir, dir); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if got := classify(event{wd: 1, mask: unix.IN_CREATE | unix.IN_ISDIR}, 1, filepath.Dir(dir), dir); got != appeared {
		t.Errorf("an event in the ancestor of a missing dir is not the dir appearing")
	}
	if got := classify(event{wd: 2, mask: unix.IN_CLOSE_WRITE}, 1, dir, dir); got != ignore {
		t.Errorf("an event of a watch given up is acted on")
	}
}

// An editor's save (rename the file away, write a new one, close it): the
// read that follows sees the new content; a write left open is read once
// it settles.
func TestWatchDirEditorSaveAndOpenWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	os.WriteFile(path, []byte("old"), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	reads := make(chan string, 100)
	done := make(chan error)
	go func() {
		done <- WatchDir(ctx, slog.New(slog.DiscardHandler), dir, time.Hour, func() {
			data, _ := os.ReadFile(path)
			reads <- string(data)
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchDir: %s", err)
		}
	})
	next := func(what string) string {
		t.Helper()
		select {
		case s := <-reads:
			return s
		case <-time.After(10 * time.Second):
			t.Fatalf("no read after %s", what)
			return ""
		}
	}
	if got := next("start"); got != "old" {
		t.Fatalf("start: read %q", got)
	}
	if err := os.Rename(path, path+"~"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The first read after the save: new content (unless the machine
	// stalled for the whole debounce between the rename and the close, when
	// the missing file is read first: then the next read is the new one).
	for got := next("the save"); got != "new"; got = next("the save") {
		if got != "" {
			t.Fatalf("after the save: read %q", got)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("er"); err != nil {
		t.Fatal(err)
	}
	// A read of the save may still be due (the debounce of the rename
	// away): "new" may come once more before the write's "newer".
	for got := next("a write left open"); got != "newer"; got = next("a write left open") {
		if got != "new" {
			t.Fatalf("write left open: read %q", got)
		}
	}
}
