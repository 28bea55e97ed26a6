package ciliumnode

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/filewatch"
	"github.com/enimasq/enimasq/cells/tablesync"
)

// ReadCiliumNodeFile reads and parses the CiliumNode file. A missing file
// gives an error wrapping fs.ErrNotExist.
func ReadCiliumNodeFile(path string) (*CiliumNode, error) {
	data, err := filewatch.ReadRegular(path, MaxCiliumNodeSize)
	if err != nil {
		return nil, err
	}
	return ParseCiliumNode(path, data)
}

// SettleTime is how long the CiliumNode file, written in place, must go
// without a write before it is read (as ipmasq.SettleTime): a half-written
// file (the empty moment of a rewrite, half the ENIs) is never read. A
// rename over the file and a ConfigMap's ..data swap are read at once.
const SettleTime = time.Second

// source keeps the enis table in step with the CiliumNode file (Run) or,
// through k8sSource, with the CiliumNode of the API server.
//
// Unlike the ip-masq-agent file, a missing CiliumNode has no defaults: until
// the file is first read the table stays uninitialized (nothing is pruned,
// allocation answers "not ready"), and once read, a file that disappears or
// goes bad leaves the last ENIs in force.
type source struct {
	*filesource.Source[*ENI, string]
	path string // the file, or "ciliumnodes/<node>": the prefix of parse errors
	// hold keeps what leaves the CiliumNode for --ciliumnode-loss-grace.
	hold *lossHold
}

func newSource(path string, p sourceParams, initDone func(statedb.WriteTxn)) *source {
	s := &source{path: path, hold: newLossHold(p.Settings.LossGrace)}
	s.Source = &filesource.Source[*ENI, string]{
		Dir: filepath.Dir(path),
		// As the ip-masq-agent file: a file written in place is read once
		// it has been stable for SettleTime, a rename over it or a
		// ConfigMap swap at once.
		Settle: SettleTime,
		File:   filepath.Base(path),
		// Read again when a hold ends, or at the resync.
		Period: func() time.Duration {
			if d := s.hold.next(); d > 0 && d < p.Settings.Resync {
				return d
			}
			return p.Settings.Resync
		},
		Read: func() (*filesource.Input[*ENI], error) {
			in, err := input(ReadCiliumNodeFile(path))
			return s.hold.apply(in), err
		},
		Failure: s.failure,
		Messages: filesource.Messages{
			Warning:    filesource.Line{Msg: "CiliumNode", Attrs: []any{"path", path}},
			Applied:    filesource.Line{Msg: "Applied CiliumNode", Attrs: []any{"path", path}},
			ValidAgain: filesource.Line{Msg: "CiliumNode file is valid again", Attrs: []any{"path", path}},
		},
		Log: p.Log, DB: p.DB, Table: p.Table, InitDone: initDone, Metrics: p.Metrics.source,
		Rows: tablesync.Rows[*ENI, string]{
			Key:   func(e *ENI) string { return e.ID },
			Query: ENIIDIndex.Query,
			Same:  (*ENI).Equal,
		},
	}
	return s
}

// input is the rows of a parsed CiliumNode: the file and the API sources
// give the same rows for the same CiliumNode.
func input(n *CiliumNode, err error) (*filesource.Input[*ENI], error) {
	if err != nil {
		return nil, err
	}
	in := &filesource.Input[*ENI]{Rows: n.ENIs, Warnings: n.Warnings, Summary: n.Summary()}
	if len(n.Refused) > 0 {
		return in, refusedError(n.Refused)
	}
	return in, nil
}

// refusedError lists the pool IPs of a CiliumNode that are refused: the
// rest of the node is in use, and health says Degraded, naming each IP and
// why, until the CiliumNode is fixed.
type refusedError []string

func (e refusedError) Error() string {
	return fmt.Sprintf("%d pool IPs refused: %s", len(e), strings.Join(e, "; "))
}

// failure reports a CiliumNode that cannot be read. Before the first good
// read a missing file is not an error of the agent (the node may not have
// ENIs yet, or the agent runs without ENI IPAM in use); after it, a missing
// or bad file keeps the last ENIs.
func (s *source) failure(err error) filesource.Failure {
	missing, first := errors.Is(err, fs.ErrNotExist), !s.Initialized()
	f := filesource.Failure{Uncounted: missing && !first, Announce: !first}
	var refused refusedError
	switch {
	case errors.As(err, &refused):
		f.Log, f.Health = "CiliumNode pool IPs refused: the rest of the node is in use", "CiliumNode pool IPs refused, the rest of the node is in use"
	case missing && first:
		f.Log, f.Attrs, f.Waiting = "CiliumNode file does not exist yet: no ENIs, no allocations until it does", []any{"path", s.path}, true
		f.Health = fmt.Sprintf("waiting for the CiliumNode file %s", s.path)
	case missing:
		f.Log, f.Attrs = "CiliumNode file disappeared: keeping the last ENIs", []any{"path", s.path}
		f.Health = "CiliumNode file disappeared, keeping the last ENIs"
	case first:
		f.Log, f.Health = "Invalid CiliumNode: no ENIs until it is fixed", "invalid CiliumNode, no ENIs yet"
	default:
		f.Log, f.Health = "Invalid CiliumNode: keeping the last ENIs", "invalid CiliumNode, keeping the last ENIs"
	}
	return f
}
