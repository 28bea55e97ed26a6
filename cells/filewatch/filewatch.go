// Package filewatch watches a directory the way Kubernetes updates mounted
// ConfigMaps and the way editors save files, so that file sources (the
// ip-masq-agent config, PolicyEndpoints, the CiliumNode) re-read their input
// when it changes: inotify on the directory, the nearest existing ancestor
// while the directory is missing, and a periodic re-read as the safety net.
//
// A change that completes a file is acted on at once: a file closed after
// writing (IN_CLOSE_WRITE), a name renamed into the directory (IN_MOVED_TO:
// an editor's or a careful writer's rename, a ConfigMap's ..data swap), a
// symlink created. The events already queued with it are coalesced into the
// same read, and so are the events that arrive while a read runs (one more
// read follows it). A change that may leave a file half done or briefly
// missing (a write still open, a new regular file, a delete, a rename away,
// a chmod) waits for the burst to settle (debounce): an editor's
// rename-away, write, close is read once the new file is closed, without
// the missing file in between.
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
	"unsafe"

	"golang.org/x/sys/unix"
)

// debounce is how long a burst of changes that may leave a file half done
// (see the package doc) must be quiet before the directory is read.
const debounce = 50 * time.Millisecond

// watchMask is what is watched on the directory.
const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// WatchDir calls reload once at start, then after every change in dir and
// every resync period, until ctx is done. While dir is missing, its nearest
// existing ancestor is watched so that dir is picked up when it appears;
// the periodic call is the safety net for missed events. ConfigMap updates
// (a `..data` symlink swap in dir) are changes in dir.
//
// It drives filesource.Source, the file source of the ip-masq-agent config,
// the PolicyEndpoint directory and the CiliumNode file.
func WatchDir(ctx context.Context, log *slog.Logger, dir string, resync time.Duration, reload func()) error {
	return WatchDirPeriod(ctx, log, dir, func() time.Duration { return resync }, reload)
}

// event is one inotify event.
type event struct {
	wd   int32
	mask uint32
	name string
}

// WatchDirPeriod is WatchDir with a resync period that the input may set:
// period is asked again after every reload (e.g. the ip-masq-agent file's
// resyncInterval).
func WatchDirPeriod(ctx context.Context, log *slog.Logger, dir string, period func() time.Duration, reload func()) error {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	// Non-blocking: the runtime poller reads it, and Close ends a Read.
	ino := os.NewFile(uintptr(fd), "inotify")
	events := make(chan []event, 64)
	readErr := make(chan error, 1)
	done := make(chan struct{})
	go readEvents(ino, events, readErr, done)
	defer func() {
		close(done)
		ino.Close()
	}()

	watched, wd := "", int32(-1)
	rewatch := func() {
		// Until the nearest existing directory is the one watched: a
		// directory created between looking for it and watching its parent
		// sends the parent no event, so look again once the watch is on.
		for target := nearestExistingDir(dir); target != watched; target = nearestExistingDir(dir) {
			if wd >= 0 {
				unix.InotifyRmWatch(fd, uint32(wd)) // fails when it was deleted: fine
			}
			watched, wd = "", -1
			w, err := unix.InotifyAddWatch(fd, target, watchMask)
			if errors.Is(err, unix.ENOENT) {
				continue // removed meanwhile: look again
			}
			if err != nil {
				log.Warn("Cannot watch directory; relying on the periodic re-read", "path", target, "error", err)
				return
			}
			watched, wd = target, int32(w)
			if target != dir {
				log.Info("Directory missing: watching for it to appear", "dir", dir, "watching", target)
			}
		}
	}

	// Watch first, then read: an update between the two is not lost.
	rewatch()
	reload()

	resync := period()
	ticker := time.NewTicker(resync)
	defer ticker.Stop()
	settle := time.NewTimer(debounce)
	settle.Stop()
	// reloadAndReset reloads and follows a changed period. The read covers
	// every event received so far: a pending settle is dropped.
	reloadAndReset := func() {
		settle.Stop()
		rewatch()
		reload()
		if p := period(); p > 0 && p != resync {
			resync = p
			ticker.Reset(resync)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case batch := <-events:
			now, later := false, false
			for more := true; more; {
				for _, ev := range batch {
					n, l := classify(ev, wd, watched, dir)
					now, later = now || n, later || l
					if ev.wd == wd && ev.mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
						watched, wd = "", -1 // the watch went with the directory
					}
					if ev.mask&unix.IN_Q_OVERFLOW != 0 {
						log.Warn("inotify queue overflow; re-reading", "dir", dir)
					}
				}
				// Coalesce what is already queued into the same read.
				select {
				case batch = <-events:
				default:
					more = false
				}
			}
			switch {
			case now:
				reloadAndReset()
			case later:
				settle.Reset(debounce)
			}
		case err := <-readErr:
			return fmt.Errorf("inotify: %w", err)
		case <-settle.C:
			reloadAndReset()
		case <-ticker.C:
			reloadAndReset()
		}
	}
}

// classify says whether ev calls for a read at once (it completes a file)
// or after the burst settles (it may leave a file half done or missing).
// wd and watched are the watch in force.
func classify(ev event, wd int32, watched, dir string) (now, later bool) {
	switch {
	case ev.mask&unix.IN_Q_OVERFLOW != 0:
		return false, true
	case ev.wd != wd:
		return false, false // a watch given up: its queued events are stale
	case ev.mask&unix.IN_IGNORED != 0:
		return false, true
	case watched != dir:
		// The ancestor of a missing dir: anything may be dir appearing.
		return true, false
	case ev.mask&(unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO) != 0:
		return true, false
	case ev.mask&unix.IN_CREATE != 0 && ev.mask&unix.IN_ISDIR == 0:
		// A symlink is complete when created; a regular file is complete
		// when closed (IN_CLOSE_WRITE).
		if fi, err := os.Lstat(filepath.Join(dir, ev.name)); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return true, false
		}
		return false, true
	}
	return false, true
}

// readEvents reads inotify events until ino is closed, sending each read's
// events.
func readEvents(ino *os.File, events chan<- []event, readErr chan<- error, done <-chan struct{}) {
	buf := make([]byte, 64<<10)
	for {
		n, err := ino.Read(buf)
		if err != nil {
			select {
			case <-done:
			default:
				readErr <- err
			}
			return
		}
		var batch []event
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			raw := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(raw.Len)]
			if i := indexZero(name); i >= 0 {
				name = name[:i]
			}
			batch = append(batch, event{wd: raw.Wd, mask: raw.Mask, name: string(name)})
			off += unix.SizeofInotifyEvent + int(raw.Len)
		}
		select {
		case events <- batch:
		case <-done:
			return
		}
	}
}

func indexZero(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
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
