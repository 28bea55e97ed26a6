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
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"

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
// the first read of the directory whatever the files hold, so that
// enforcement starts; only a file that cannot be read at all (not a regular
// file, no permission, too large) and never was read puts nothing in force.
type policySource struct {
	*filesource.Source[*PolicyEndpoint, string] // Dir is the directory
	// cluster is the source of cluster-policy-endpoints: the same read of
	// the directory (or, with the API server, a watch of its own).
	cluster *filesource.Source[*ClusterPolicyEndpoint, string]
	node    nodeconfig.Config
	files   filesource.Parts[*policyFile] // last good version, by file name
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
		clusterUnknown: newUnknownFields(ClusterPolicyEndpointKind, unknown)}
	s.Source = &filesource.Source[*PolicyEndpoint, string]{
		Dir:    dir,
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
func (s *policySource) Run(ctx context.Context, health cell.Health) error {
	clusterHealth := health.NewScope(ClusterScope)
	return filewatch.Watch(ctx, s.Log, filewatch.Options{Dir: s.Dir, Period: s.Period, Settle: s.Settle}, func() {
		pe, cpe := s.read()
		s.Update(health, pe.in, pe.err)
		s.cluster.Update(clusterHealth, cpe.in, cpe.err)
	})
}

// readResult is what a read of the directory gives one table.
type readResult[T any] struct {
	in  *filesource.Input[T]
	err error
}

// fileErrors are the errors of one file, by the kind of the objects they
// are about; an error about no object (the file cannot be read) is both's.
type fileErrors struct{ pe, cpe error }

// read reads the directory: the objects of each file (for a file that is
// not valid, what resolve and resolveClusters put in force), merged by
// kind, and the errors of the files in error, by kind.
func (s *policySource) read() (readResult[*PolicyEndpoint], readResult[*ClusterPolicyEndpoint]) {
	names, summary, err := s.listFiles()
	if err != nil {
		return readResult[*PolicyEndpoint]{err: err}, readResult[*ClusterPolicyEndpoint]{err: err}
	}
	var mu sync.Mutex
	invalid := map[string]*policyFile{} // what a file in error puts in force
	errsOf := map[string]fileErrors{}
	files, _, _ := s.files.Read(names, func(name string, last *policyFile) (*policyFile, error) {
		f, inForce, errs := s.readFile(name, last)
		if inForce != nil || errs != (fileErrors{}) {
			mu.Lock()
			if inForce != nil {
				invalid[name] = inForce
			}
			errsOf[name] = errs
			mu.Unlock()
		}
		if errs != (fileErrors{}) {
			return nil, errors.Join(errs.pe, errs.cpe)
		}
		return f, nil
	})
	files = maps.Clone(files) // Parts' own map holds the good versions only
	maps.Copy(files, invalid)
	var peErrs, cpeErrs []error
	for _, name := range names {
		peErrs = append(peErrs, errsOf[name].pe)
		cpeErrs = append(cpeErrs, errsOf[name].cpe)
	}

	desired, extra := merge(names, files)
	pe := readResult[*PolicyEndpoint]{in: s.input(desired, extra), err: joinErrors(errors.Join(peErrs...))}
	slices.Sort(pe.in.Warnings)
	pe.in.Summary = summary
	if summary == "" {
		pe.in.Summary = fmt.Sprintf("%d PolicyEndpoints from %d files in %s", len(pe.in.Rows), len(names), s.Dir)
	}
	clusters, clusterExtra := mergeClusters(names, files)
	cpe := readResult[*ClusterPolicyEndpoint]{in: s.clusterInput(clusters, clusterExtra), err: joinErrors(errors.Join(cpeErrs...))}
	slices.Sort(cpe.in.Warnings)
	cpe.in.Summary = strings.ReplaceAll(summary, "no PolicyEndpoints", "no ClusterPolicyEndpoints")
	if summary == "" {
		cpe.in.Summary = fmt.Sprintf("%d ClusterPolicyEndpoints from %d files in %s", len(cpe.in.Rows), len(names), s.Dir)
	}
	return pe, cpe
}

// listFiles returns the names of the files in the directory, sorted,
// skipping hidden names (a ConfigMap mount's ..data and its
// timestamped directories; the files are symlinks into them). A missing
// directory has no files; the summary then says so.
func (s *policySource) listFiles() ([]string, string, error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Sprintf("%s does not exist: no PolicyEndpoints", s.Dir), nil
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
		if fi, err := os.Stat(filepath.Join(s.Dir, name)); err != nil || fi.IsDir() { // follows symlinks
			continue
		}
		names = append(names, name)
	}
	return names, "", nil
}

// readFile reads and parses one file, reusing the last good parse when the
// content is unchanged. For a file that is not valid it returns the errors,
// by kind, and what the file puts in force (resolve, resolveClusters),
// unless nothing of it can be read (then its last good version stays).
func (s *policySource) readFile(name string, last *policyFile) (good, inForce *policyFile, errs fileErrors) {
	path := filepath.Join(s.Dir, name)
	data, err := filewatch.ReadRegular(path, MaxPolicyEndpointFileSize)
	if err != nil {
		return nil, nil, fileErrors{err, err}
	}
	digest := sha256.Sum256(data)
	if last != nil && last.digest == digest {
		return last, nil, fileErrors{}
	}
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
