// Package filewatch watches a directory the way Kubernetes updates mounted
// ConfigMaps and the way editors save files, so that file sources (the
// ip-masq-agent config, PolicyEndpoints, the CiliumNode) re-read their input
// when it changes: fsnotify on the directory with a short debounce, the
// nearest existing ancestor while the directory is missing, and a periodic
// re-read as the safety net.
package filewatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
)

// debounce groups the burst of events of one update (a ConfigMap's symlink
// swap, an editor's write-and-rename) into one read.
const debounce = 50 * time.Millisecond

// WatchDir calls reload once at start, then after every burst of changes in
// dir (debounced) and every resync period, until ctx is done. While dir is
// missing, its nearest existing ancestor is watched so that dir is picked up
// when it appears; the periodic call is the safety net for missed events.
// ConfigMap updates (a `..data` symlink swap in dir) are changes in dir.
//
// It drives filesource.Source, the file source of the ip-masq-agent config,
// the PolicyEndpoint directory and the CiliumNode file.
func WatchDir(ctx context.Context, log *slog.Logger, dir string, resync time.Duration, reload func()) error {
	return WatchDirPeriod(ctx, log, dir, func() time.Duration { return resync }, reload)
}

// WatchDirPeriod is WatchDir with a resync period that the input may set:
// period is asked again after every reload (e.g. the ip-masq-agent file's
// resyncInterval).
func WatchDirPeriod(ctx context.Context, log *slog.Logger, dir string, period func() time.Duration, reload func()) error {
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("fsnotify: %w", err)
	}
	defer watcher.Close()

	watched := ""
	rewatch := func() {
		target := nearestExistingDir(dir)
		if target == watched {
			return
		}
		if watched != "" {
			watcher.Remove(watched) // fails when it was deleted: fine
		}
		watched = ""
		if err := watcher.Add(target); err != nil {
			log.Warn("Cannot watch directory; relying on the periodic re-read", "path", target, "error", err)
			return
		}
		watched = target
		if target != dir {
			log.Info("Directory missing: watching for it to appear", "dir", dir, "watching", target)
		}
	}

	// Watch first, then read: an update between the two is not lost.
	rewatch()
	reload()

	resync := period()
	ticker := time.NewTicker(resync)
	defer ticker.Stop()
	// reloadAndReset reloads and follows a changed period.
	reloadAndReset := func() {
		rewatch()
		reload()
		if p := period(); p > 0 && p != resync {
			resync = p
			ticker.Reset(resync)
		}
	}
	settle := time.NewTimer(debounce)
	settle.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-watcher.Events:
			if !ok {
				return errors.New("fsnotify watcher closed")
			}
			if ev.Name == watched && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				watched = "" // the watch went with the directory
			}
			settle.Reset(debounce)
		case err, ok := <-watcher.Errors:
			if !ok {
				return errors.New("fsnotify watcher closed")
			}
			log.Warn("fsnotify error; re-reading", "dir", dir, "error", err)
			settle.Reset(debounce)
		case <-settle.C:
			reloadAndReset()
		case <-ticker.C:
			reloadAndReset()
		}
	}
}

// nearestExistingDir is dir, or its closest ancestor that exists.
func nearestExistingDir(dir string) string {
	for {
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return dir
		}
		dir = parent
	}
}

// ReadRegular reads the file at path, at most limit+1 bytes (so that the
// caller's parser can say that it is too large), refusing anything but a
// regular file. The file is opened
// without blocking and its type checked on the open descriptor before it is
// read: a FIFO, a device, a socket or a directory at the path never blocks
// the watcher, and errors say what was there. A missing file gives an error
// wrapping fs.ErrNotExist.
func ReadRegular(path string, limit int64) ([]byte, error) {
	// The type is checked before opening (opening a device runs its
	// driver), and again on the descriptor (the path may change between).
	if fi, err := os.Stat(path); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s): refused", path, describeType(fi.Mode()))
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s): refused", path, describeType(fi.Mode()))
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return data, nil
}

func describeType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return m.Type().String()
}
