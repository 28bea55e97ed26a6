package filewatch

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Anything but a regular file is refused at once, with what it is; nothing
// blocks (a FIFO without a writer would block a plain open forever).
func TestReadRegularRefusesWithoutBlocking(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	regular := filepath.Join(dir, "file")
	os.WriteFile(regular, []byte("0123456789"), 0o600)

	for _, tc := range []struct{ path, want string }{
		{fifo, "not a regular file (a FIFO): refused"},
		{dir, "not a regular file (a directory): refused"},
		{sock, "not a regular file (a socket): refused"},
		{"/dev/zero", "not a regular file (a character device): refused"},
	} {
		done := make(chan error, 1)
		go func() { _, err := ReadRegular(tc.path, 1<<20); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), tc.path+": "+tc.want) {
				t.Errorf("%s: got %v, want %q", tc.path, err, tc.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: ReadRegular blocked", tc.path)
		}
	}
	if _, err := ReadRegular(filepath.Join(dir, "missing"), 10); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want fs.ErrNotExist", err)
	}
	if data, err := ReadRegular(regular, 4); err != nil || string(data) != "01234" {
		t.Errorf("regular file with limit 4: %q, %v (want limit+1 bytes)", data, err)
	}
}
