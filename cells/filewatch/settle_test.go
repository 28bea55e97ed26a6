package filewatch

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// read is what a reload saw, and when.
type read struct {
	data string
	at   time.Time
}

// watchSettle runs Watch with settle on dir, each reload reading path.
func watchSettle(t *testing.T, dir, path string, settle time.Duration) <-chan read {
	t.Helper()
	return startWatch(t, func(ctx context.Context, reload func()) error {
		return Watch(ctx, slog.New(slog.DiscardHandler), Options{Dir: dir, Period: func() time.Duration { return time.Hour }, Settle: settle}, reload)
	}, func() read {
		data, _ := os.ReadFile(path)
		return read{string(data), time.Now()}
	})
}

// A file truncated and written in chunks, with pauses shorter than the
// settle time, some chunks with an open and a close of their own, is read
// once: when it has not changed for the settle time.
func TestWatchSettlesAFileWrittenInPlace(t *testing.T) {
	const settle = 400 * time.Millisecond
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	os.WriteFile(path, []byte("old"), 0o644)
	reads := watchSettle(t, dir, path, settle)

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []string{"a", "b", "c"} {
		time.Sleep(settle / 4)
		f.WriteString(chunk)
	}
	f.Close() // IN_CLOSE_WRITE of a half-written file
	for _, chunk := range []string{"d", "e"} {
		time.Sleep(settle / 4)
		g, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		g.WriteString(chunk)
		g.Close()
	}
	last := time.Now()
	r := next(t, reads, "the write in place")
	if r.data != "abcde" {
		t.Fatalf("read %q before the write settled", r.data)
	}
	if waited := r.at.Sub(last); waited < settle || waited > settle+300*time.Millisecond {
		t.Errorf("read %s after the last write, want the settle time %s (+ < 300ms)", waited, settle)
	}
	select {
	case r := <-reads:
		t.Errorf("a second read: %q", r.data)
	case <-time.After(settle):
	}
}

// A rename over the file and a ConfigMap's ..data swap are read at once,
// even with a long settle time; a rename over a file still settling ends
// its settling.
func TestWatchRenameAndSwapDoNotSettle(t *testing.T) {
	const settle = 5 * time.Second
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	os.WriteFile(path, []byte("old"), 0o644)
	reads := watchSettle(t, dir, path, settle)

	check := func(what, want string, start time.Time) {
		t.Helper()
		r := next(t, reads, what)
		for r.data != want && r.at.Sub(start) < settle {
			r = next(t, reads, what)
		}
		if r.data != want || r.at.Sub(start) >= settle/5 {
			t.Errorf("%s: read %q after %s, want %q at once", what, r.data, r.at.Sub(start), want)
		}
	}
	start := time.Now()
	os.WriteFile(path+".tmp", []byte("renamed"), 0o644)
	os.Rename(path+".tmp", path)
	check("a rename", "renamed", start)

	start = time.Now()
	os.WriteFile(path, []byte("in place"), 0o644) // settling
	os.WriteFile(path+".tmp", []byte("renamed over"), 0o644)
	os.Rename(path+".tmp", path)
	check("a rename over a write in place", "renamed over", start)

	// The ConfigMap layout: f -> ..data/f, ..data -> ..2026_a.
	os.Remove(path)
	for _, d := range []string{"..2026_a", "..2026_b"} {
		os.Mkdir(filepath.Join(dir, d), 0o755)
		os.WriteFile(filepath.Join(dir, d, "f"), []byte(d), 0o644)
	}
	os.Symlink("..2026_a", filepath.Join(dir, "..data"))
	os.Symlink("..data/f", path)
	check("a ConfigMap mount", "..2026_a", time.Now())
	start = time.Now()
	os.Symlink("..2026_b", filepath.Join(dir, "..data_tmp"))
	os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data"))
	check("a ..data swap", "..2026_b", start)
}
