package source

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/filewatch"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// The files of the directory, read for every kind at once: each file is
// parsed once, its objects of every kind kept by the file (fileState), and
// each kind's table takes its own (table.go).

// policyFile is the last good version of one file, or what it puts in
// force while it is not valid.
type policyFile struct {
	digest [sha256.Size]byte
	rows   []endpoints.Object // of every kind, in the file's order
}

// smallFile is the size under which a file is parsed at once by the read;
// larger ones are parsed by jobs, in parallel, and applied as each is done.
const smallFile = 64 << 10

// fileState is what one file puts in force: its last good version, what it
// puts in force while not valid, and its errors.
type fileState struct {
	fp      fingerprint // of the file last parsed (zero: read it again)
	good    *policyFile
	inForce *policyFile // while not valid: each kind's resolve
	errs    fileErrors
}

// current is what the file puts in force (nil: nothing).
func (f *fileState) current() *policyFile {
	if f.inForce != nil {
		return f.inForce
	}
	return f.good
}

// parseJob is the parse of a large file, in the background; it may outlive
// the read that started it (the next read takes its result).
type parseJob struct {
	fp      fingerprint
	done    chan struct{}
	good    *policyFile
	inForce *policyFile
	errs    fileErrors
}

// fileErrors are the errors of one file, by the kind (the index in the
// source's tables) of the objects they are about; an error about no object
// (the file cannot be read) is every kind's. nil: none.
type fileErrors []error

// ok says whether the file has no error.
func (e fileErrors) ok() bool {
	for _, err := range e {
		if err != nil {
			return false
		}
	}
	return true
}

// dirRead is what a read of the directory gives the tables: the names of
// the files in force, how many files the directory lists, and whether the
// read is incomplete; or the error of a directory that cannot be listed.
type dirRead struct {
	names      []string
	files      int
	incomplete bool
	err        error
}

// read reads the whole directory, holding nothing.
func (s *policySource) read() dirRead {
	d, _ := s.readDir(nil, nil)
	return d
}

// readDir reads the directory: the objects of each file (for a file that
// is not valid, what each kind's resolve puts in force) and the errors of
// the files in error, by kind, which each table merges (table.go). A file
// that r holds keeps what it put in force (a new one is left out, and the
// read is incomplete); one that cannot be read keeps its last good
// version. Small files are parsed at once, large ones by jobs: while jobs
// run, partial is given what is parsed so far (the others at their last
// state) each time a job is done; and when events arrive meanwhile
// (r.Pending), readDir stops (stopped) with the jobs still running, for
// the next read to take their results. A missing directory gives an error
// wrapping fs.ErrNotExist.
func (s *policySource) readDir(r *filewatch.Read, partial func(dirRead)) (d dirRead, stopped bool) {
	listed, err := s.listFiles()
	if err != nil {
		return dirRead{err: err}, false
	}
	// The names in force: those listed, and those held that have a state
	// (renamed away or deleted a moment ago: maybe coming back).
	names := slices.Clone(listed)
	for _, name := range r.HeldNames() {
		if _, ok := s.files[name]; ok && !slices.Contains(listed, name) && !strings.HasPrefix(name, ".") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for name := range s.files {
		if !slices.Contains(names, name) {
			delete(s.files, name) // removed from the directory
		}
	}
	for name := range s.jobs {
		if !slices.Contains(listed, name) {
			delete(s.jobs, name)
		}
	}
	incomplete := false
	waiting := map[string]*parseJob{}
	// Small files first, each read and parsed here; large ones by jobs,
	// which read them too: the read goes on without them.
	var large []string
	for _, name := range listed {
		if r.Held(name) {
			if _, ok := s.files[name]; !ok {
				incomplete = true // being written, never read: unknown yet
			}
			continue
		}
		st := s.files[name]
		if st == nil {
			st = &fileState{}
			s.files[name] = st
		}
		path := filepath.Join(s.dir, name)
		fp, size, ok := fingerprintOf(path)
		if ok && fp == st.fp && (st.good != nil || st.inForce != nil) {
			delete(s.jobs, name) // unchanged since it was parsed
			continue
		}
		if size >= smallFile {
			large = append(large, name)
			continue
		}
		delete(s.jobs, name)
		good, inForce, errs := s.readFile(name, st.good)
		st.set(good, inForce, errs)
		if ok && errs.ok() || inForce != nil {
			st.fp = fp
		} else {
			st.fp = fingerprint{}
		}
	}
	for _, name := range large {
		st := s.files[name]
		fp, _, _ := fingerprintOf(filepath.Join(s.dir, name))
		job := s.jobs[name]
		if job == nil || job.fp != fp || fp == (fingerprint{}) {
			job = s.startJob(name, fp, st.good)
			s.jobs[name] = job
		}
		waiting[name] = job
	}
	result := func(final bool) dirRead {
		return dirRead{names: names, files: len(listed), incomplete: incomplete || !final}
	}
	// take applies the jobs done; it says whether any was.
	take := func() bool {
		any := false
		for name, job := range waiting {
			select {
			case <-job.done:
				st := s.files[name]
				st.set(job.good, job.inForce, job.errs)
				st.fp = fingerprint{}
				if job.errs.ok() || job.inForce != nil {
					st.fp = job.fp
				}
				delete(waiting, name)
				delete(s.jobs, name)
				any = true
			default:
			}
		}
		return any
	}
	take()
	if len(waiting) > 0 && partial != nil {
		partial(result(false)) // what is parsed, while the large files parse
	}
	for len(waiting) > 0 {
		if r.Pending() {
			return d, true
		}
		select {
		case <-s.jobDone:
		case <-time.After(5 * time.Millisecond): // to look at r.Pending
		}
		if take() && len(waiting) > 0 && partial != nil {
			partial(result(false))
		}
	}
	return result(true), false
}

// set puts a parse's result in force.
func (f *fileState) set(good, inForce *policyFile, errs fileErrors) {
	if good != nil {
		f.good = good
	}
	f.inForce, f.errs = inForce, errs
}

// startJob reads and parses a large file in the background.
func (s *policySource) startJob(name string, fp fingerprint, last *policyFile) *parseJob {
	job := &parseJob{fp: fp, done: make(chan struct{})}
	notify := s.jobDone
	go func() {
		s.sem <- struct{}{}
		job.good, job.inForce, job.errs = s.readFile(name, last)
		<-s.sem
		close(job.done)
		select {
		case notify <- struct{}{}:
		default:
		}
	}()
	return job
}

// fingerprint tells a file's content changed without reading it: its
// inode, size, and modification and change times (any write changes
// them).
type fingerprint struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
}

// fingerprintOf is path's fingerprint (symlinks followed) and size; false
// when it cannot be had.
func fingerprintOf(path string) (fingerprint, int64, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fingerprint{}, 0, false
	}
	return fingerprint{dev: uint64(st.Dev), ino: st.Ino, size: st.Size,
		mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}, st.Size, true
}

// listFiles returns the names of the files in the directory, sorted,
// skipping hidden names (a ConfigMap mount's ..data and its
// timestamped directories; the files are symlinks into them). A missing
// directory is an error wrapping fs.ErrNotExist.
func (s *policySource) listFiles() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, err // missing (reported by missing)
	}
	if err != nil {
		return nil, fmt.Errorf("read PolicyEndpoint directory: %w", err)
	}
	var names []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		// A dangling symlink (a ConfigMap swap in progress) and a directory
		// (lost+found on a volume's root) are skipped; any other entry is
		// read, so that a FIFO, a device or a socket is refused with what it
		// is (filewatch.ReadRegular).
		if fi, err := os.Stat(filepath.Join(s.dir, name)); err != nil || fi.IsDir() { // follows symlinks
			continue
		}
		names = append(names, name)
	}
	return names, nil
}

// readFile reads and parses one file, reusing last (its last good
// version) when the content is unchanged; as parseFile.
func (s *policySource) readFile(name string, last *policyFile) (good, inForce *policyFile, errs fileErrors) {
	data, err := filewatch.ReadRegular(filepath.Join(s.dir, name), MaxPolicyEndpointFileSize)
	if err != nil {
		return nil, nil, s.everyKind(err) // the last good version stays
	}
	digest := sha256.Sum256(data)
	if last != nil && last.digest == digest {
		return last, nil, nil
	}
	return s.parseFile(name, data, digest, last)
}

// everyKind is err as the error of every kind.
func (s *policySource) everyKind(err error) fileErrors {
	errs := make(fileErrors, len(s.tables))
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// parseFile parses one file's data. For a file that is not valid it
// returns the errors, by kind, and what the file puts in force (each
// kind's resolve, given last, its last good version), unless nothing of
// it can be read (then its last good version stays). It is safe for
// concurrent use.
func (s *policySource) parseFile(name string, data []byte, digest [sha256.Size]byte, last *policyFile) (good, inForce *policyFile, errs fileErrors) {
	path := filepath.Join(s.dir, name)
	objs, err := parsePolicyFile(path, data)
	if err == nil {
		f := &policyFile{digest: digest}
		for _, o := range objs {
			f.rows = append(f.rows, o.row)
		}
		return f, nil, nil
	}
	if len(objs) == 0 {
		return nil, nil, s.everyKind(err)
	}
	var lastRows []endpoints.Object
	if last != nil {
		lastRows = last.rows
	}
	// An error is its object's kind's; that of an object whose kind is
	// guessed is also every other kind's of which the file had last good
	// objects (they stay, as it may be one of them).
	byKind := make([][]error, len(s.tables))
	add := func(i int, err error) {
		if !slices.Contains(byKind[i], err) {
			byKind[i] = append(byKind[i], err)
		}
	}
	for _, o := range objs {
		if o.err == nil {
			continue
		}
		for i, t := range s.tables {
			if t.of(o.row) {
				add(i, o.err)
			}
		}
		for i, t := range s.tables {
			if o.guessed && slices.ContainsFunc(lastRows, t.of) {
				add(i, o.err)
			}
		}
	}
	inForce = &policyFile{}
	errs = make(fileErrors, len(s.tables))
	for i, t := range s.tables {
		inForce.rows = append(inForce.rows, t.resolve(objs, lastRows)...)
		errs[i] = errors.Join(byKind[i]...)
	}
	return nil, inForce, errs
}
