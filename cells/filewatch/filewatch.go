// Package filewatch watches a directory the way Kubernetes updates mounted
// ConfigMaps and the way editors save files, so that file sources (the
// ip-masq-agent config, PolicyEndpoints, the CiliumNode) re-read their input
// when it changes: inotify on the directory, the nearest existing ancestor
// while the directory is missing, and a periodic re-read as the safety net.
//
// It reads inotify itself rather than through fsnotify, because what to do
// depends on what fsnotify (v1.10.1) does not say: it has no IN_CLOSE_WRITE
// (a file closed after writing: an unexported op there), and it reports
// IN_CREATE and IN_MOVED_TO both as Create, so a name renamed in (a file
// complete, to read at once) cannot be told from a new file still being
// written (to let settle). Reading inotify, the events of one read also come
// together, so a burst is coalesced into one reload.
//
// Every read is of the whole directory, and is told which names to hold
// (Read.Held): names whose file may be half done, whose last state the
// reader keeps in force, as if the read had not seen them. A read is not
// deferred for a name that is held: the other names are read.
//
// A change that replaces a file whole is read at once: a name renamed into
// the directory (IN_MOVED_TO: an editor's or a careful writer's rename over
// the file, `mv`, a ConfigMap's ..data swap), a symlink created. It ends the
// holding of that name. The events already queued with it are coalesced
// into the same read.
//
// A directory that appears (watched through its nearest existing ancestor
// while missing) is watched at once and read once it has settled: after
// Settle (or the debounce), so that a directory made again and filled is
// not read empty.
//
// A change that may leave a file briefly missing (a delete, a rename away,
// a chmod) holds its name for a short debounce (50 ms), after which it is
// read: an editor's rename-away, write, close is read once the new file is
// there, without the missing file in between; a file deleted for good is
// read as deleted after the debounce.
//
// A file written in place (IN_MODIFY: a write or a truncation;
// IN_CLOSE_WRITE; a new regular file, IN_CREATE) is, by default, read at
// once when closed and after the debounce while still open. With
// Options.Settle, its name is held until it has been stable for Settle: no
// write to it for that long, whether it is closed or not, then read. A
// writer that truncates a file and writes it in chunks, or opens and closes
// it for each chunk, is read once, when done, not at each half-written
// state; a rename over the file meanwhile is read at once. The periodic
// re-read is never deferred, and holds no name that has been held for a
// whole period: a file that never stops changing is still read every
// period.
package filewatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
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
	return Watch(ctx, log, Options{Dir: dir, Period: period}, func(*Read) { reload() })
}

// Options say what Watch watches and how.
type Options struct {
	Dir    string               // the directory watched
	Period func() time.Duration // the re-read period, asked again after every reload
	// Settle, when positive, is how long a file written in place must go
	// without a write before it is read; until then its name is held (see
	// the package doc); 0 reads it when closed.
	Settle time.Duration
}

// Read is what a reload is told about the read it is to make.
type Read struct {
	held    map[string]bool
	pending func() bool
	// Again, set by the reload, asks for another read as soon as the
	// events that arrived meanwhile are taken in (a reload that stopped
	// early to let them in: Pending).
	Again bool
}

// Held says whether the file name (a name in the directory) may be half
// done: the reader keeps its last state of it in force (or, with none,
// leaves it out), as if it had not seen it. It will be read again when it
// is no longer held.
func (r *Read) Held(name string) bool { return r != nil && r.held[name] }

// HeldNames are the names held, in no order.
func (r *Read) HeldNames() []string {
	if r == nil {
		return nil
	}
	out := make([]string, 0, len(r.held))
	for name := range r.held {
		out = append(out, name)
	}
	return out
}

// Pending says whether events have arrived since the read began: a reload
// that reads much (a directory of large files) may apply what it has,
// stop, and set Again, so that a change made meanwhile (a small file
// written) is not held behind the rest.
func (r *Read) Pending() bool { return r != nil && r.pending != nil && r.pending() }

// hold is a name held: since when, and until when.
type hold struct{ since, until time.Time }

// Watch calls reload once at start, then as the package doc says, with
// what each read is to hold, until ctx is done.
func Watch(ctx context.Context, log *slog.Logger, o Options, reload func(*Read)) error {
	dir, period := o.Dir, o.Period
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	// Non-blocking: the runtime poller reads it, and Close ends a Read.
	ino := os.NewFile(uintptr(fd), "inotify")
	events := make(chan []event, 64)
	readErr := make(chan error, 1)
	done := make(chan struct{})
	var sent, taken atomic.Uint64 // batches sent by readEvents, taken by the loop
	go readEvents(ino, events, readErr, done, &sent)
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

	// held are the names held; due, when set, is when a read of no name
	// in particular is due (an event without a name, after the debounce).
	held := map[string]hold{}
	var due time.Time
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// arm sets the timer to the next read due: due, or the end of the
	// earliest hold.
	arm := func() {
		next := due
		for _, h := range held {
			if next.IsZero() || h.until.Before(next) {
				next = h.until
			}
		}
		timer.Stop()
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), 0))
		}
	}
	holdFor := func(name string, d time.Duration) {
		now := time.Now()
		h, ok := held[name]
		if !ok {
			h.since = now
		}
		if until := now.Add(d); until.After(h.until) {
			h.until = until
		}
		held[name] = h
	}

	// take handles a batch of events; it says whether a read is due at
	// once.
	take := func(batch []event) (now bool) {
		taken.Add(1)
		for _, ev := range batch {
			switch c := classify(ev, wd, watched, dir); {
			case c == appeared:
				// The directory may be back: watch it at once (so that
				// the files written into it are seen), and read it once
				// it has settled as a file written in place does: a
				// directory made again and filled is not read empty
				// or half filled.
				rewatch()
				if watched == dir {
					if d := time.Now().Add(cmp.Or(o.Settle, debounce)); d.After(due) {
						due = d
					}
				}
			case c == readNow:
				now = true
				delete(held, ev.name) // replaced whole
			case c == readLater && ev.name == "":
				if due.IsZero() {
					due = time.Now().Add(debounce)
				}
			case c == readLater && ev.mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
				// Gone: a file written in place there has nothing left to
				// settle; the name is held for the debounce (an editor's
				// rename away and write back).
				delete(held, ev.name)
				holdFor(ev.name, debounce)
			case c == readLater:
				holdFor(ev.name, debounce)
			case o.Settle > 0 && (c == written || c == writeClosed):
				holdFor(ev.name, o.Settle)
			case c == writeClosed:
				now = true
				delete(held, ev.name)
			case c == written:
				holdFor(ev.name, debounce)
			}
			if ev.wd == wd && ev.mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
				watched, wd = "", -1 // the watch went with the directory
			}
			if ev.mask&unix.IN_Q_OVERFLOW != 0 {
				log.Warn("inotify queue overflow; re-reading", "dir", dir)
			}
		}
		return now
	}
	// drain takes what is already queued, so that it is coalesced into
	// the read about to be made.
	drain := func() (now bool) {
		for {
			select {
			case batch := <-events:
				now = take(batch) || now
			default:
				return now
			}
		}
	}

	resync := period()
	var ticker *time.Ticker
	// read reads, holding the names held (with periodic, not those held
	// for a whole period), and follows a changed period. The read covers
	// every event taken so far: what was due and the holds that ended go.
	read := func(periodic bool) {
		for {
			drain()
			t := time.Now()
			r := &Read{held: map[string]bool{}, pending: func() bool { return sent.Load() != taken.Load() }}
			for name, h := range held {
				switch {
				case !h.until.After(t.Add(time.Millisecond)):
					delete(held, name) // its hold ends: read it now
				case periodic && t.Sub(h.since) >= resync:
					delete(held, name) // held for a whole period: read it anyway
				default:
					r.held[name] = true
				}
			}
			due = time.Time{}
			rewatch()
			reload(r)
			if p := period(); p > 0 && p != resync {
				resync = p
				ticker.Reset(resync)
			}
			if !r.Again {
				break
			}
			periodic = false
		}
		arm()
	}

	// Watch first, then read: an update between the two is not lost.
	rewatch()
	ticker = time.NewTicker(resync)
	defer ticker.Stop()
	read(false)
	for {
		select {
		case <-ctx.Done():
			return nil
		case batch := <-events:
			if take(batch) || drain() {
				read(false)
			} else {
				arm()
			}
		case err := <-readErr:
			return fmt.Errorf("inotify: %w", err)
		case <-timer.C:
			read(false)
		case <-ticker.C:
			read(true)
		}
	}
}

// What an event calls for.
const (
	ignore      = iota
	readNow     // it replaces a file whole: read at once
	readLater   // it may leave a file missing: read after the debounce
	written     // a file written in place, maybe still open
	writeClosed // a file written in place and closed
	appeared    // in the ancestor of a missing dir: dir may have appeared
)

// classify says what ev calls for. wd and watched are the watch in force.
func classify(ev event, wd int32, watched, dir string) int {
	switch {
	case ev.mask&unix.IN_Q_OVERFLOW != 0:
		return readLater
	case ev.wd != wd:
		return ignore // a watch given up: its queued events are stale
	case ev.mask&unix.IN_IGNORED != 0:
		return readLater
	case watched != dir:
		// The ancestor of a missing dir: anything may be dir appearing.
		return appeared
	case ev.mask&unix.IN_MOVED_TO != 0:
		return readNow
	case ev.mask&unix.IN_CLOSE_WRITE != 0:
		return writeClosed
	case ev.mask&unix.IN_MODIFY != 0:
		return written
	case ev.mask&unix.IN_CREATE != 0 && ev.mask&unix.IN_ISDIR == 0:
		// A symlink is complete when created; a regular file is written.
		if fi, err := os.Lstat(filepath.Join(dir, ev.name)); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return readNow
		}
		return written
	}
	return readLater
}

// readEvents reads inotify events until ino is closed, sending each read's
// events.
func readEvents(ino *os.File, events chan<- []event, readErr chan<- error, done <-chan struct{}, sent *atomic.Uint64) {
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
		sent.Add(1)
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
