package source

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/filewatch"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/cells/tablesync"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// policySource keeps policy-endpoints and cluster-policy-endpoints equal to
// the PolicyEndpoint and ClusterPolicyEndpoint files of a directory: the
// kind of each document decides its table, and a file may hold both. Each
// file stands alone, and fails closed (recover.go, recover_cluster.go): in
// a file that is not valid, each valid object applies, an invalid one keeps
// its last good version, and one without a last good version is replaced by
// its stand-in (a PolicyEndpoint's isolates the pods it names in the
// directions it names; a ClusterPolicyEndpoint's denies its pods everything
// but their node); each table's source is Degraded, naming the file, field
// and value, until its objects are valid. Both tables are initialized after
// the first read of the directory (one that exists) whatever the files hold, so that
// enforcement starts; only a file that cannot be read at all (not a regular
// file, no permission, too large) and never was read puts nothing in force.
type policySource struct {
	*filesource.Source[*PolicyEndpoint, string] // Dir is the directory
	// cluster is the source of cluster-policy-endpoints: the same read of
	// the directory (or, with the API server, a watch of its own).
	cluster *filesource.Source[*ClusterPolicyEndpoint, string]
	node    nodeconfig.Config
	files   map[string]*fileState // by file name: what each file puts in force
	jobs    map[string]*parseJob  // by file name: large files being parsed
	jobDone chan struct{}         // a job is done
	sem     chan struct{}         // bounds the jobs running at once
	// unknown and clusterUnknown name the fields of each kind's objects
	// that enimasq does not know (unknown.go), from files or the API.
	unknown, clusterUnknown *unknownFields
}

// policyFile is the last good version of one file.
type policyFile struct {
	digest    [sha256.Size]byte
	endpoints []*PolicyEndpoint
	clusters  []*ClusterPolicyEndpoint
}

// ClusterScope is the health scope, below the source's job, of
// cluster-policy-endpoints.
const ClusterScope = "cluster-policy-endpoints"

// newPolicySource is the source of the directory settings.Path. base and
// clusterBase are what the cell gives it for each table: log, database,
// table, initializer and metrics.
func newPolicySource(settings Settings, node nodeconfig.Config, base filesource.Source[*PolicyEndpoint, string],
	clusterBase filesource.Source[*ClusterPolicyEndpoint, string], unknown *prometheus.CounterVec) *policySource {
	dir, resync := settings.Path, settings.Resync
	s := &policySource{node: node, unknown: newUnknownFields(PolicyEndpointKind, unknown),
		files: map[string]*fileState{}, jobs: map[string]*parseJob{}, jobDone: make(chan struct{}, 1),
		sem:            make(chan struct{}, runtime.GOMAXPROCS(0)),
		clusterUnknown: newUnknownFields(ClusterPolicyEndpointKind, unknown)}
	s.Source = &filesource.Source[*PolicyEndpoint, string]{
		Dir:    dir,
		Settle: SettleTime,
		Period: func() time.Duration { return resync },
		Failure: filesource.Always(filesource.Failure{Log: "Invalid PolicyEndpoints: their last good versions stay, or their pods are isolated",
			Health: "invalid PolicyEndpoint files: their last good objects stay, or their pods are isolated", Announce: true}),
		Messages: filesource.Messages{
			Warning:    filesource.Line{Msg: "PolicyEndpoint"},
			Applied:    filesource.Line{Msg: "Applied PolicyEndpoints"},
			ValidAgain: filesource.Line{Msg: "PolicyEndpoint files are valid again", Attrs: []any{"dir", dir}},
		},
		Log: base.Log, DB: base.DB, Table: base.Table, InitDone: base.InitDone, Metrics: base.Metrics,
		Rows: tablesync.Rows[*PolicyEndpoint, string]{
			Key:   (*PolicyEndpoint).Key,
			Query: endpoints.PolicyEndpointNameIndex.Query,
			Same:  func(old, pe *PolicyEndpoint) bool { return old == pe || reflect.DeepEqual(old, pe) },
		},
	}
	s.cluster = &filesource.Source[*ClusterPolicyEndpoint, string]{
		Dir:    dir,
		Period: func() time.Duration { return resync },
		Failure: filesource.Always(filesource.Failure{Log: "Invalid ClusterPolicyEndpoints: their last good versions stay, or their pods are denied everything but their node",
			Health: "invalid ClusterPolicyEndpoint files: their last good objects stay, or their pods are denied everything but their node", Announce: true}),
		Messages: filesource.Messages{
			Warning:    filesource.Line{Msg: "ClusterPolicyEndpoint"},
			Applied:    filesource.Line{Msg: "Applied ClusterPolicyEndpoints"},
			ValidAgain: filesource.Line{Msg: "ClusterPolicyEndpoint files are valid again", Attrs: []any{"dir", dir}},
		},
		Log: clusterBase.Log, DB: clusterBase.DB, Table: clusterBase.Table, InitDone: clusterBase.InitDone, Metrics: clusterBase.Metrics,
		Rows: tablesync.Rows[*ClusterPolicyEndpoint, string]{
			Key:   (*ClusterPolicyEndpoint).Key,
			Query: endpoints.ClusterPolicyEndpointNameIndex.Query,
			Same:  func(old, cpe *ClusterPolicyEndpoint) bool { return old == cpe || reflect.DeepEqual(old, cpe) },
		},
	}
	return s
}

// Run reads the directory at start, after every change in it (or in its
// nearest existing ancestor while it is missing) and every period, until ctx
// is done, and puts each read into both tables: policy-endpoints reports on
// health, cluster-policy-endpoints on its scope ClusterScope.
//
// A file written in place is read once it has been stable for SettleTime
// (until then its objects in force stay: a truncated file is never read as
// "no objects"); a file renamed into the directory, or a ConfigMap swap, at
// once. Files are applied as they are parsed (readDir): a small file is not
// held behind the parsing of large ones. A directory that is missing keeps
// the objects in force, and at start leaves both tables uninitialized (the
// reconcilers prune nothing), with health Degraded naming it, until it
// is there; only a file removed from an existing directory removes its
// objects.
func (s *policySource) Run(ctx context.Context, health cell.Health) error {
	clusterHealth := health.NewScope(ClusterScope)
	return filewatch.Watch(ctx, s.Log, filewatch.Options{Dir: s.Dir, Period: s.Period, Settle: s.Settle}, func(r *filewatch.Read) {
		pe, cpe, stopped := s.readDir(r, func(pe readResult[*PolicyEndpoint], cpe readResult[*ClusterPolicyEndpoint]) {
			s.ApplyPartial(pe.in)
			s.cluster.ApplyPartial(cpe.in)
		})
		if stopped {
			r.Again = true // events came meanwhile: take them in, read again
			return
		}
		if pe.in == nil && errors.Is(pe.err, fs.ErrNotExist) {
			s.Fail(health, pe.err, s.missing())
			s.cluster.Fail(clusterHealth, cpe.err, s.missing())
			return
		}
		s.Update(health, pe.in, pe.err)
		s.cluster.Update(clusterHealth, cpe.in, cpe.err)
	})
}

// missing is how a missing directory is reported.
func (s *policySource) missing() filesource.Failure {
	what := "the last objects stay in force"
	if !s.Initialized() {
		what = "nothing is in force yet and nothing is pruned"
	}
	return filesource.Failure{
		Log:    "PolicyEndpoint directory missing: " + what,
		Attrs:  []any{"dir", s.Dir},
		Health: fmt.Sprintf("PolicyEndpoint directory %s does not exist: %s", s.Dir, what),
	}
}

// SettleTime is how long a file of the directory, written in place, must go
// without a write before it is read (as ipmasq.SettleTime).
const SettleTime = time.Second

// smallFile is the size under which a file is parsed at once by the read;
// larger ones are parsed by jobs, in parallel, and applied as each is done.
const smallFile = 64 << 10

// fileState is what one file puts in force: its last good version, what it
// puts in force while not valid, and its errors.
type fileState struct {
	fp      fingerprint // of the file last parsed (zero: read it again)
	good    *policyFile
	inForce *policyFile // while not valid: resolve's and resolveClusters' objects
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

// readResult is what a read of the directory gives one table.
type readResult[T any] struct {
	in  *filesource.Input[T]
	err error
}

// fileErrors are the errors of one file, by the kind of the objects they
// are about; an error about no object (the file cannot be read) is both's.
type fileErrors struct{ pe, cpe error }

// read reads the whole directory, holding nothing, and returns what it
// gives each table.
func (s *policySource) read() (readResult[*PolicyEndpoint], readResult[*ClusterPolicyEndpoint]) {
	pe, cpe, _ := s.readDir(nil, nil)
	return pe, cpe
}

// readDir reads the directory: the objects of each file (for a file that
// is not valid, what resolve and resolveClusters put in force), merged by
// kind, and the errors of the files in error, by kind. A file that r holds
// keeps what it put in force (a new one is left out, and the input is
// incomplete); one that cannot be read keeps its last good version. Small
// files are parsed at once, large ones by jobs: while jobs run, partial is
// given what is parsed so far (the others at their last state) each time a
// job is done; and when events arrive meanwhile (r.Pending), readDir
// stops (stopped) with the jobs still running, for the next read to take
// their results. A missing directory gives an error wrapping
// fs.ErrNotExist and no input.
func (s *policySource) readDir(r *filewatch.Read, partial func(readResult[*PolicyEndpoint], readResult[*ClusterPolicyEndpoint])) (
	pe readResult[*PolicyEndpoint], cpe readResult[*ClusterPolicyEndpoint], stopped bool) {
	if s.files == nil {
		s.files, s.jobs, s.jobDone = map[string]*fileState{}, map[string]*parseJob{}, make(chan struct{}, 1)
		s.sem = make(chan struct{}, runtime.GOMAXPROCS(0))
	}
	listed, err := s.listFiles()
	if err != nil {
		return readResult[*PolicyEndpoint]{err: err}, readResult[*ClusterPolicyEndpoint]{err: err}, false
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
		path := filepath.Join(s.Dir, name)
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
		if ok && errs == (fileErrors{}) || inForce != nil {
			st.fp = fp
		} else {
			st.fp = fingerprint{}
		}
	}
	for _, name := range large {
		st := s.files[name]
		fp, _, _ := fingerprintOf(filepath.Join(s.Dir, name))
		job := s.jobs[name]
		if job == nil || job.fp != fp || fp == (fingerprint{}) {
			job = s.startJob(name, fp, st.good)
			s.jobs[name] = job
		}
		waiting[name] = job
	}
	result := func(final bool) (readResult[*PolicyEndpoint], readResult[*ClusterPolicyEndpoint]) {
		return s.result(names, len(listed), incomplete || !final)
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
				if job.errs == (fileErrors{}) || job.inForce != nil {
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
			return pe, cpe, true
		}
		select {
		case <-s.jobDone:
		case <-time.After(5 * time.Millisecond): // to look at r.Pending
		}
		if take() && len(waiting) > 0 && partial != nil {
			partial(result(false))
		}
	}
	pe, cpe = result(true)
	return pe, cpe, false
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

// result merges what the files of names put in force into each table's
// input; files is how many files the directory lists.
func (s *policySource) result(names []string, files int, incomplete bool) (readResult[*PolicyEndpoint], readResult[*ClusterPolicyEndpoint]) {
	inForce := make(map[string]*policyFile, len(names))
	var peErrs, cpeErrs []error
	for _, name := range names {
		st := s.files[name]
		if st == nil {
			continue
		}
		if f := st.current(); f != nil {
			inForce[name] = f
		}
		peErrs = append(peErrs, st.errs.pe)
		cpeErrs = append(cpeErrs, st.errs.cpe)
	}
	desired, extra := merge(names, inForce)
	pe := readResult[*PolicyEndpoint]{in: s.input(desired, extra), err: joinErrors(errors.Join(peErrs...))}
	slices.Sort(pe.in.Warnings)
	pe.in.Summary = fmt.Sprintf("%d PolicyEndpoints from %d files in %s", len(pe.in.Rows), files, s.Dir)
	pe.in.Incomplete = incomplete
	clusters, clusterExtra := mergeClusters(names, inForce)
	cpe := readResult[*ClusterPolicyEndpoint]{in: s.clusterInput(clusters, clusterExtra), err: joinErrors(errors.Join(cpeErrs...))}
	slices.Sort(cpe.in.Warnings)
	cpe.in.Summary = fmt.Sprintf("%d ClusterPolicyEndpoints from %d files in %s", len(cpe.in.Rows), files, s.Dir)
	cpe.in.Incomplete = incomplete
	return pe, cpe
}

// listFiles returns the names of the files in the directory, sorted,
// skipping hidden names (a ConfigMap mount's ..data and its
// timestamped directories; the files are symlinks into them). A missing
// directory is an error wrapping fs.ErrNotExist.
func (s *policySource) listFiles() ([]string, error) {
	entries, err := os.ReadDir(s.Dir)
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
		if fi, err := os.Stat(filepath.Join(s.Dir, name)); err != nil || fi.IsDir() { // follows symlinks
			continue
		}
		names = append(names, name)
	}
	return names, nil
}

// readFile reads and parses one file, reusing last (its last good
// version) when the content is unchanged; as parseFile.
func (s *policySource) readFile(name string, last *policyFile) (good, inForce *policyFile, errs fileErrors) {
	data, err := filewatch.ReadRegular(filepath.Join(s.Dir, name), MaxPolicyEndpointFileSize)
	if err != nil {
		return nil, nil, fileErrors{err, err} // the last good version stays
	}
	digest := sha256.Sum256(data)
	if last != nil && last.digest == digest {
		return last, nil, fileErrors{}
	}
	return s.parseFile(name, data, digest, last)
}

// parseFile parses one file's data. For a file that is not valid it
// returns the errors, by kind, and what the file puts in force (resolve,
// resolveClusters, given last, its last good version), unless nothing of
// it can be read (then its last good version stays). It is safe for
// concurrent use.
func (s *policySource) parseFile(name string, data []byte, digest [sha256.Size]byte, last *policyFile) (good, inForce *policyFile, errs fileErrors) {
	path := filepath.Join(s.Dir, name)
	objs, err := parsePolicyFile(path, data)
	if err != nil {
		if len(objs) == 0 {
			return nil, nil, fileErrors{err, err}
		}
		var lastGood []*PolicyEndpoint
		var lastClusters []*ClusterPolicyEndpoint
		if last != nil {
			lastGood, lastClusters = last.endpoints, last.clusters
		}
		// An error is its object's kind's; that of an object whose kind is
		// guessed is also the other kind's when the file had last good
		// objects of it (they stay, as it may be one of them).
		var pes, cpes []error
		add := func(errs []error, err error) []error {
			if slices.Contains(errs, err) {
				return errs
			}
			return append(errs, err)
		}
		for _, o := range objs {
			switch {
			case o.err == nil:
				continue
			case o.cpe != nil:
				cpes = add(cpes, o.err)
			default:
				pes = add(pes, o.err)
			}
			if o.guessed && len(lastGood) > 0 {
				pes = add(pes, o.err)
			}
			if o.guessed && len(lastClusters) > 0 {
				cpes = add(cpes, o.err)
			}
		}
		return nil, &policyFile{endpoints: resolve(objs, lastGood), clusters: resolveClusters(objs, lastClusters)},
			fileErrors{errors.Join(pes...), errors.Join(cpes...)}
	}
	f := &policyFile{digest: digest}
	for _, o := range objs {
		if o.cpe != nil {
			f.clusters = append(f.clusters, o.cpe)
		} else {
			f.endpoints = append(f.endpoints, o.pe)
		}
	}
	return f, nil, fileErrors{}
}

// merge returns the objects of all files by key, and the warnings to add
// to them: an object defined in two files is taken from the first by name,
// with a warning.
func merge(names []string, files map[string]*policyFile) (map[string]*PolicyEndpoint, map[string][]string) {
	desired, extra := map[string]*PolicyEndpoint{}, map[string][]string{}
	for _, name := range names {
		f := files[name]
		if f == nil {
			continue
		}
		for _, pe := range f.endpoints {
			if _, dup := desired[pe.Key()]; dup {
				extra[pe.Key()] = append(extra[pe.Key()], fmt.Sprintf("also defined in %s: that copy is ignored", pe.File))
				continue
			}
			desired[pe.Key()] = pe
		}
	}
	return desired, extra
}

// input is the rows of desired, sorted by key, each with the warnings of
// this node (nodeWarnings) and extra added (to a copy: the object may be a
// last good version), and all their warnings, each prefixed with its key;
// their unknown fields are named (unknown.go).
func (s *policySource) input(desired map[string]*PolicyEndpoint, extra map[string][]string) *filesource.Input[*PolicyEndpoint] {
	in := &filesource.Input[*PolicyEndpoint]{}
	unknown := map[string][]string{}
	for _, key := range slices.Sorted(maps.Keys(desired)) {
		pe := desired[key]
		unknown[key] = pe.Unknown
		if more := append(nodeWarnings(pe, s.node), extra[key]...); len(more) > 0 {
			c := *pe
			c.Warnings = append(slices.Clone(pe.Warnings), more...)
			pe = &c
		}
		for _, w := range pe.Warnings {
			in.Warnings = append(in.Warnings, key+": "+w)
		}
		in.Rows = append(in.Rows, pe)
	}
	in.Note = s.unknown.note(s.Log, unknown)
	return in
}

// nodeWarnings names what of pe this node does not program: pod IPs and
// rules of a family it does not run.
func nodeWarnings(pe *PolicyEndpoint, node nodeconfig.Config) []string {
	var out []string
	for _, p := range pe.Pods {
		if !node.FamilyEnabled(p.PodIP) {
			out = append(out, fmt.Sprintf("spec.podSelectorEndpoints: podIP %s: %s: not programmed", p.PodIP, familyDisabled(p.PodIP)))
		}
	}
	for _, d := range []bpf.Direction{bpf.Ingress, bpf.Egress} {
		for i, r := range pe.Rules(d) {
			if node.FamilyEnabled(r.CIDR.Addr()) {
				continue
			}
			w := fmt.Sprintf("spec.%s[%d]: cidr %s: %s: rule skipped", d, i, r.CIDR, familyDisabled(r.CIDR.Addr()))
			if n := len(r.Except); n > 0 {
				w += fmt.Sprintf(" with its %d excepts", n)
			}
			out = append(out, w)
		}
	}
	return out
}

func familyDisabled(a interface{ Is4() bool }) string {
	if a.Is4() {
		return "IPv4 is disabled on this node (--enable-ipv4=false)"
	}
	return "IPv6 is disabled on this node (--enable-ipv6=false)"
}
