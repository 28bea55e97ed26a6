package filewatch

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
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
		return Watch(ctx, slog.New(slog.DiscardHandler), Options{Dir: dir, Period: func() time.Duration { return time.Hour }, Settle: settle},
			func(r *Read) {
				if !r.Held(filepath.Base(path)) {
					reload()
				}
			})
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

// readHeld is what a reload saw of each name, and which names it held.
type readHeld struct {
	files map[string]string
	held  []string
	at    time.Time
}

// watchHeld runs Watch with settle on dir, each reload reading every file
// of dir and what it holds.
func watchHeld(t *testing.T, dir string, settle time.Duration) <-chan readHeld {
	t.Helper()
	var last *Read
	return startWatch(t, func(ctx context.Context, reload func()) error {
		return Watch(ctx, slog.New(slog.DiscardHandler), Options{Dir: dir, Period: func() time.Duration { return time.Hour }, Settle: settle},
			func(r *Read) { last = r; reload() })
	}, func() readHeld {
		rh := readHeld{files: map[string]string{}, held: last.HeldNames(), at: time.Now()}
		slices.Sort(rh.held)
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			data, _ := os.ReadFile(filepath.Join(dir, e.Name()))
			rh.files[e.Name()] = string(data)
		}
		return rh
	})
}

// A rename over one file is read at once while another file of the
// directory, written in place, is still settling: the read holds the
// settling one (and not the renamed one), which is read when it settles.
func TestWatchRenameIsNotHeldBehindAnotherFileSettling(t *testing.T) {
	const settle = 3 * time.Second
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("old"), 0o644)
	os.WriteFile(filepath.Join(dir, "g"), []byte("old"), 0o644)
	reads := watchHeld(t, dir, settle)

	os.WriteFile(filepath.Join(dir, "g"), []byte("half"), 0o644) // settling
	start := time.Now()
	os.WriteFile(filepath.Join(dir, ".f.tmp"), []byte("renamed"), 0o644)
	os.Rename(filepath.Join(dir, ".f.tmp"), filepath.Join(dir, "f"))
	r := next(t, reads, "the rename")
	if took := r.at.Sub(start); took >= settle/5 || r.files["f"] != "renamed" || !slices.Contains(r.held, "g") || slices.Contains(r.held, "f") {
		t.Fatalf("after the rename: read after %s, f %q, held %v; want at once, \"renamed\", g held, f not", took, r.files["f"], r.held)
	}
	gWritten := time.Now()
	for r.files["g"] != "half" || slices.Contains(r.held, "g") {
		r = next(t, reads, "g settling")
	}
	if took := r.at.Sub(gWritten); took < settle-settle/5 {
		t.Errorf("g read without a hold %s after its write, before the settle time %s", took, settle)
	}
}

// A name renamed away (an editor's backup rename) is held for the
// debounce: the read that the rename into the backup name calls for at
// once does not take the file for deleted.
func TestWatchHoldsANameRenamedAway(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	os.WriteFile(path, []byte("old"), 0o644)
	reads := watchHeld(t, dir, time.Second)
	os.Rename(path, path+"~")
	r := next(t, reads, "the rename away")
	if _, there := r.files["f"]; !there && !slices.Contains(r.held, "f") {
		t.Fatalf("f read as missing, not held: held %v", r.held)
	}
}

// A reload that stops early (Pending, Again) is called again once the
// events that came meanwhile are taken in, with their holds.
func TestWatchAgainAfterPending(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("old"), 0o644)
	type call struct {
		pending bool
		held    []string
	}
	calls := make(chan call, 100)
	first := true
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- Watch(ctx, slog.New(slog.DiscardHandler), Options{Dir: dir, Period: func() time.Duration { return time.Hour }, Settle: time.Hour},
			func(r *Read) {
				if first {
					first = false
					calls <- call{}
					return
				}
				// The second read: wait for an event to come, then stop
				// early.
				os.WriteFile(filepath.Join(dir, "g"), []byte("in place"), 0o644)
				deadline := time.Now().Add(10 * time.Second)
				for !r.Pending() && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				c := call{pending: r.Pending(), held: r.HeldNames()}
				if c.pending && !slices.Contains(c.held, "g") {
					r.Again = true
				}
				calls <- c
			})
	}()
	t.Cleanup(func() { cancel(); <-done })
	next(t, calls, "start")
	os.WriteFile(filepath.Join(dir, ".x"), []byte("x"), 0o644)
	os.Rename(filepath.Join(dir, ".x"), filepath.Join(dir, "x"))
	if c := next(t, calls, "the rename"); !c.pending {
		t.Fatal("the event written during the read is not pending")
	}
	if c := next(t, calls, "again"); !slices.Contains(c.held, "g") {
		t.Fatalf("the read again does not hold g, written in place meanwhile: %v", c.held)
	}
}

// A directory removed, made again and filled is read once it has settled:
// never empty in between.
func TestWatchDirectoryMadeAgainSettles(t *testing.T) {
	const settle = 500 * time.Millisecond
	dir := filepath.Join(t.TempDir(), "d")
	os.Mkdir(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	reads := watchHeld(t, dir, settle)
	os.RemoveAll(dir)
	for r := next(t, reads, "the removal"); len(r.files) > 0; r = next(t, reads, "the removal") {
	}
	os.Mkdir(dir, 0o755)
	time.Sleep(settle / 5) // the writer takes its time
	os.WriteFile(filepath.Join(dir, ".f"), []byte("y"), 0o644)
	os.Rename(filepath.Join(dir, ".f"), filepath.Join(dir, "f"))
	if r := next(t, reads, "the directory made again"); r.files["f"] != "y" {
		t.Fatalf("the directory made again read as %v", r.files)
	}
}
