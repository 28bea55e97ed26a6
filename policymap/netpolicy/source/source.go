package source

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"runtime"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/filewatch"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// policySource keeps a table per kind (policy-endpoints,
// cluster-policy-endpoints) equal to the objects of that kind in the files
// of a directory: the kind of each document decides its table, and a file
// may hold every kind. Each file stands alone, and fails closed
// (recover.go): in a file that is not valid, each valid object applies, an
// invalid one keeps its last good version, and one without a last good
// version is replaced by its stand-in (a PolicyEndpoint's isolates the
// pods it names in the directions it names; a ClusterPolicyEndpoint's
// denies its pods everything but their node); each table's source is
// Degraded, naming the file, field and value, until its objects are valid.
// The tables are initialized after the first read of the directory (one
// that exists) whatever the files hold, so that enforcement starts; only a
// file that cannot be read at all (not a regular file, no permission, too
// large) and never was read puts nothing in force.
type policySource struct {
	dir    string
	period func() time.Duration
	settle time.Duration
	log    *slog.Logger
	node   nodeconfig.Config
	// tables are the kinds' tables, in the order of kinds: the first
	// reports on the job's health, the others on their scopes.
	tables []kindTable

	files   map[string]*fileState // by file name: what each file puts in force
	jobs    map[string]*parseJob  // by file name: large files being parsed
	jobDone chan struct{}         // a job is done
	sem     chan struct{}         // bounds the jobs running at once
}

// newPolicySource is the source of the directory settings.Path into
// tables, each made of what the cell gives it (newTable): log, database,
// table, initializer and metrics; unknown counts the fields of their
// objects enimasq does not know.
func newPolicySource(settings Settings, node nodeconfig.Config, unknown *prometheus.CounterVec, tables ...kindTable) *policySource {
	s := &policySource{dir: settings.Path, period: func() time.Duration { return settings.Resync }, settle: SettleTime,
		node: node, tables: tables,
		files: map[string]*fileState{}, jobs: map[string]*parseJob{}, jobDone: make(chan struct{}, 1),
		sem: make(chan struct{}, runtime.GOMAXPROCS(0))}
	for i, t := range tables {
		t.setUp(s, i, unknown)
		if i == 0 {
			s.log = t.logger()
		}
	}
	return s
}

// Run reads the directory at start, after every change in it (or in its
// nearest existing ancestor while it is missing) and every period, until
// ctx is done, and puts each read into every table: the first reports on
// health, the others on their scopes (ClusterScope).
//
// A file written in place is read once it has been stable for SettleTime
// (until then its objects in force stay: a truncated file is never read as
// "no objects"); a file renamed into the directory, or a ConfigMap swap, at
// once. Files are applied as they are parsed (readDir): a small file is not
// held behind the parsing of large ones. A directory that is missing keeps
// the objects in force, and at start leaves the tables uninitialized (the
// reconcilers prune nothing), with health Degraded naming it, until it
// is there; only a file removed from an existing directory removes its
// objects.
func (s *policySource) Run(ctx context.Context, health cell.Health) error {
	healths := make([]cell.Health, len(s.tables))
	for i, t := range s.tables {
		healths[i] = t.health(health)
	}
	return filewatch.Watch(ctx, s.log, filewatch.Options{Dir: s.dir, Period: s.period, Settle: s.settle}, func(r *filewatch.Read) {
		d, stopped := s.readDir(r, func(d dirRead) {
			for _, t := range s.tables {
				t.applyPartial(d)
			}
		})
		if stopped {
			r.Again = true // events came meanwhile: take them in, read again
			return
		}
		if errors.Is(d.err, fs.ErrNotExist) {
			missing := s.missing()
			for i, t := range s.tables {
				t.fail(healths[i], d.err, missing)
			}
			return
		}
		for i, t := range s.tables {
			t.update(healths[i], d)
		}
	})
}

// missing is how a missing directory is reported.
func (s *policySource) missing() filesource.Failure {
	what := "the last objects stay in force"
	if !s.tables[0].initialized() {
		what = "nothing is in force yet and nothing is pruned"
	}
	return filesource.Failure{
		Log:    "PolicyEndpoint directory missing: " + what,
		Attrs:  []any{"dir", s.dir},
		Health: fmt.Sprintf("PolicyEndpoint directory %s does not exist: %s", s.dir, what),
	}
}

// SettleTime is how long a file of the directory, written in place, must go
// without a write before it is read (as ipmasq.SettleTime).
const SettleTime = time.Second
