package source

import (
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

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/filewatch"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/cells/tablesync"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// policySource keeps policy-endpoints equal to the PolicyEndpoint files of
// a directory. Each file stands alone, and fails closed (recover.go): in a
// file that is not valid, each valid object applies, an invalid one keeps
// its last good version, and one without a last good version is replaced
// by its stand-in, which isolates the pods it names in the directions it
// names; the source is Degraded, naming the file, field and value, until
// the file is valid. The table is initialized after the first read of the
// directory whatever the files hold, so that enforcement starts; only a
// file that cannot be read at all (not a regular file, no permission, too
// large) and never was read puts nothing in force.
type policySource struct {
	*filesource.Source[*PolicyEndpoint, string] // Dir is the directory
	node                                        nodeconfig.Config
	files                                       filesource.Parts[*policyFile] // last good version, by file name
}

// policyFile is the last good version of one file.
type policyFile struct {
	digest    [sha256.Size]byte
	endpoints []*PolicyEndpoint
}

// newPolicySource is the source of the directory settings.Path. base is
// what the cell gives it: log, database, table, initializer and metrics.
func newPolicySource(settings Settings, node nodeconfig.Config, base filesource.Source[*PolicyEndpoint, string]) *policySource {
	dir, resync := settings.Path, settings.Resync
	s := &policySource{node: node}
	s.Source = &filesource.Source[*PolicyEndpoint, string]{
		Dir:    dir,
		Period: func() time.Duration { return resync },
		Read:   s.read,
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
	return s
}

// read reads the directory: the objects of each file (for a file that is
// not valid, what resolve puts in force), merged, and the errors of the
// files in error.
func (s *policySource) read() (*filesource.Input[*PolicyEndpoint], error) {
	names, summary, err := s.listFiles()
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	invalid := map[string]*policyFile{} // what a file in error puts in force
	files, _, errs := s.files.Read(names, func(name string, last *policyFile) (*policyFile, error) {
		f, inForce, err := s.readFile(name, last)
		if inForce != nil {
			mu.Lock()
			invalid[name] = inForce
			mu.Unlock()
		}
		return f, err
	})
	files = maps.Clone(files) // Parts' own map holds the good versions only
	maps.Copy(files, invalid)
	in := s.input(merge(names, files))
	slices.Sort(in.Warnings)
	in.Summary = summary
	if summary == "" {
		in.Summary = fmt.Sprintf("%d PolicyEndpoints from %d files in %s", len(in.Rows), len(names), s.Dir)
	}
	return in, joinErrors(errs)
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
// content is unchanged. For a file that is not valid it returns the error
// and what the file puts in force (resolve), unless nothing of it can be
// read (then its last good version stays).
func (s *policySource) readFile(name string, last *policyFile) (good, inForce *policyFile, err error) {
	path := filepath.Join(s.Dir, name)
	data, err := filewatch.ReadRegular(path, MaxPolicyEndpointFileSize)
	if err != nil {
		return nil, nil, err
	}
	digest := sha256.Sum256(data)
	if last != nil && last.digest == digest {
		return last, nil, nil
	}
	objs, err := parsePolicyFile(path, data)
	if err != nil {
		if len(objs) == 0 {
			return nil, nil, err
		}
		var lastGood []*PolicyEndpoint
		if last != nil {
			lastGood = last.endpoints
		}
		return nil, &policyFile{endpoints: resolve(objs, lastGood)}, err
	}
	pes := make([]*PolicyEndpoint, 0, len(objs))
	for _, o := range objs {
		pes = append(pes, o.pe)
	}
	return &policyFile{digest: digest, endpoints: pes}, nil, nil
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
// last good version), and all their warnings, each prefixed with its key.
func (s *policySource) input(desired map[string]*PolicyEndpoint, extra map[string][]string) *filesource.Input[*PolicyEndpoint] {
	in := &filesource.Input[*PolicyEndpoint]{}
	for _, key := range slices.Sorted(maps.Keys(desired)) {
		pe := desired[key]
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
