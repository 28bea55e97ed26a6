package netpolicy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/filewatch"
	"github.com/enimasq/enimasq/cells/metrics"
	"github.com/enimasq/enimasq/cells/nodeconfig"
)

// policySource keeps policy-endpoints equal to the PolicyEndpoint files of
// a directory. Each file stands alone: an invalid file keeps the objects of
// its last good version (none if it never was valid) and marks the source
// Degraded, while the other files still apply.
type policySource struct {
	dir      string
	resync   time.Duration
	log      *slog.Logger
	db       *statedb.DB
	table    statedb.RWTable[*PolicyEndpoint]
	node     nodeconfig.Config
	initDone func(statedb.WriteTxn) // nil once the table is initialized
	metrics  *metrics.Source

	files map[string]*policyFile // last good version, by file name

	lastErr      string // logged once per distinct error
	lastWarnings string // logged once per distinct set
	lastSummary  string
}

// policyFile is the last good version of one file.
type policyFile struct {
	digest    [sha256.Size]byte
	endpoints []*PolicyEndpoint
}

// run watches the directory (or its nearest existing ancestor while it is
// missing) and re-reads it on changes and every resync period.
func (s *policySource) run(ctx context.Context, health cell.Health) error {
	return filewatch.WatchDir(ctx, s.log, s.dir, s.resync, func() { s.reload(health) })
}

// reload reads the directory and applies it.
func (s *policySource) reload(health cell.Health) {
	if s.files == nil {
		s.files = map[string]*policyFile{}
	}
	names, summary, err := s.listFiles()
	if err != nil {
		s.report(health, err, "")
		return
	}
	var errs []error
	complete := true // every file has a good version
	current := map[string]*policyFile{}
	for _, name := range names {
		f, err := s.readFile(name, s.files[name])
		if err != nil {
			errs = append(errs, err)
			if last := s.files[name]; last != nil {
				current[name] = last // keep the last good version
			} else {
				complete = false
			}
			continue
		}
		current[name] = f
	}
	s.files = current

	desired, warnings := s.merge(names)
	// A file that was never valid may hold objects a previous run
	// programmed: the table is initialized (and the maps pruned) only once
	// every file has been valid. Until then the valid files still apply.
	changed := s.apply(desired, complete)
	if summary == "" {
		summary = fmt.Sprintf("%d PolicyEndpoints from %d files in %s", len(desired), len(names), s.dir)
	}
	if w := strings.Join(warnings, "\n"); w != s.lastWarnings {
		s.lastWarnings = w
		for _, warning := range warnings {
			s.log.Warn("PolicyEndpoint", "warning", warning)
		}
	}
	if changed > 0 || summary != s.lastSummary {
		s.log.Info("Applied PolicyEndpoints", "summary", summary, "rows-changed", changed)
		s.lastSummary = summary
	}
	s.report(health, errors.Join(errs...), summary)
}

// report sets health: Degraded while any file is invalid (its last good
// objects stay), OK otherwise.
func (s *policySource) report(health cell.Health, err error, summary string) {
	if err != nil {
		s.metrics.Error()
		if msg := err.Error(); msg != s.lastErr {
			s.lastErr = msg
			s.log.Error("Invalid PolicyEndpoints: keeping the last good objects of the files in error", "error", err)
		}
		health.Degraded("invalid PolicyEndpoint files, keeping their last good objects", err)
		return
	}
	if s.lastErr != "" {
		s.log.Info("PolicyEndpoint files are valid again", "dir", s.dir)
		s.lastErr = ""
	}
	s.metrics.Success()
	health.OK(summary)
}

// listFiles returns the names of the files in the directory, sorted,
// skipping hidden names (a ConfigMap mount's ..data and its
// timestamped directories; the files are symlinks into them). A missing
// directory has no files; the summary then says so.
func (s *policySource) listFiles() ([]string, string, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Sprintf("%s does not exist: no PolicyEndpoints", s.dir), nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("read PolicyEndpoint directory: %w", err)
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
	return names, "", nil
}

// readFile reads and parses one file, reusing the last good parse when the
// content is unchanged.
func (s *policySource) readFile(name string, last *policyFile) (*policyFile, error) {
	path := filepath.Join(s.dir, name)
	data, err := filewatch.ReadRegular(path, MaxPolicyEndpointFileSize)
	if err != nil {
		return nil, err
	}
	digest := sha256.Sum256(data)
	if last != nil && last.digest == digest {
		return last, nil
	}
	pes, err := ParsePolicyEndpoints(path, data)
	if err != nil {
		return nil, err
	}
	return &policyFile{digest: digest, endpoints: pes}, nil
}

// merge returns the objects of all files by key, each with its warnings
// (the parser's and this node's). An object defined in two files is taken
// from the first by name, with a warning.
func (s *policySource) merge(names []string) (map[string]*PolicyEndpoint, []string) {
	desired := map[string]*PolicyEndpoint{}
	extra := map[string][]string{}
	for _, name := range names {
		f := s.files[name]
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
	var all []string
	for key, pe := range desired {
		warnings := append(slices.Clone(pe.Warnings), nodeWarnings(pe, s.node)...)
		warnings = append(warnings, extra[key]...)
		if len(warnings) != len(pe.Warnings) {
			c := *pe
			c.Warnings = warnings
			desired[key] = &c
		}
		for _, w := range warnings {
			all = append(all, key+": "+w)
		}
	}
	slices.Sort(all)
	return desired, all
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

// apply writes the difference between the table and desired in one
// transaction; unchanged objects keep their revision. With complete, the
// table is marked initialized. It returns the number of objects inserted,
// changed or deleted.
func (s *policySource) apply(desired map[string]*PolicyEndpoint, complete bool) int {
	wtxn := s.db.WriteTxn(s.table)
	var stale []*PolicyEndpoint
	for old := range s.table.All(wtxn) {
		if _, ok := desired[old.Key()]; !ok {
			stale = append(stale, old)
		}
	}
	changed := len(stale)
	for _, old := range stale {
		s.table.Delete(wtxn, old)
	}
	for _, key := range slices.Sorted(maps.Keys(desired)) {
		pe := desired[key]
		old, _, found := s.table.Get(wtxn, PolicyEndpointNameIndex.Query(key))
		if found && (old == pe || reflect.DeepEqual(old, pe)) {
			continue
		}
		s.table.Insert(wtxn, pe)
		changed++
	}
	if s.initDone != nil && complete {
		s.initDone(wtxn)
		s.initDone = nil
	}
	wtxn.Commit()
	return changed
}
