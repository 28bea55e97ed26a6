package celltest

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// WriteFileAtomic replaces path the way a careful writer does: a temporary
// file renamed over it (its directory made first).
func WriteFileAtomic(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// RewriteInPlace rewrites the YAML list file at path in place, the way a
// careless writer does: truncated, then header and a "- item" line for each
// item, in chunks with a pause before each (the file empty for the first).
// The first half of the items is written through the file kept open, each
// of the others opened, appended and closed.
func RewriteInPlace(t testing.TB, path, header string, items []string, pause time.Duration) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(pause) // the file empty
	f.WriteString(header)
	half := len(items) / 2
	for _, p := range items[:half] {
		time.Sleep(pause)
		f.WriteString("- " + p + "\n")
	}
	f.Close()
	for _, p := range items[half:] {
		time.Sleep(pause)
		g, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		g.WriteString("- " + p + "\n")
		g.Close()
	}
}
