package fqdn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// What the pods were told outlives a restart of the agent: the rows of
// policy-fqdn, with their absolute expiries, are in a checkpoint in the
// state directory, read back before anything starts, so that the
// compiler's first version of a pod already holds them and a pod that
// connects after the restart with an answer it got before is not denied.
// The checkpoint is a snapshot, written as the table changes (at most once
// a second), and a journal: every row whose addresses grew is appended to
// it before the answer is released (a line, no sync: it is the agent that
// restarts, not the node), and the snapshot's writer empties it. The files
// are not trusted: a row that is not what this package writes is dropped,
// they are bounded in size, and the per-pod cap holds as for the proxy's
// rows.

const (
	checkpointName    = "policy-fqdn.json"
	journalName       = "policy-fqdn.journal"
	checkpointVersion = 1
	// checkpointEvery is the least time between two writes.
	checkpointEvery = time.Second
	// maxCheckpoint bounds what is read: far more than the caps allow a
	// node (pods x MaxIPsPerPod rows of about 100 bytes).
	maxCheckpoint = 64 << 20
)

type checkpoint struct {
	Version int                  `json:"version"`
	Names   []*endpoints.DNSName `json:"names"`
}

// restore reads the snapshot and then the journal into policy-fqdn (in
// wtxn; a later row of a pod and name replaces an earlier one): the rows
// that have not expired and hold what this package writes. It returns how
// many rows it restored; a file that cannot be read is an error (the
// agent goes on without what it could not read).
func (l *learner) restore(wtxn statedb.WriteTxn, dir string) (int, error) {
	var rows []*endpoints.DNSName
	var errs []error
	data, err := readBounded(filepath.Join(dir, checkpointName))
	if err == nil && data != nil {
		var cp checkpoint
		switch err := json.Unmarshal(data, &cp); {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", checkpointName, err))
		case cp.Version != checkpointVersion:
			errs = append(errs, fmt.Errorf("%s: version %d, want %d", checkpointName, cp.Version, checkpointVersion))
		default:
			rows = cp.Names
		}
	} else if err != nil {
		errs = append(errs, err)
	}
	journal, err := readBounded(filepath.Join(dir, journalName))
	if err != nil {
		errs = append(errs, err)
	}
	for line := range bytes.Lines(journal) {
		var row endpoints.DNSName
		if json.Unmarshal(line, &row) == nil {
			rows = append(rows, &row) // a torn last line is skipped
		}
	}
	latest := map[string]*endpoints.DNSName{}
	var order []string
	for _, row := range rows {
		row = validRow(row, l.now(), l.settings.MaxIPsPerName)
		if row == nil {
			continue
		}
		if _, ok := latest[row.Key()]; !ok {
			order = append(order, row.Key())
		}
		latest[row.Key()] = row
	}
	perPod := map[netip.Addr]int{}
	n := 0
	for _, key := range order {
		row := latest[key]
		if perPod[row.Pod]+len(row.IPs) > l.settings.MaxIPsPerPod {
			continue
		}
		if _, _, err := l.names.Insert(wtxn, row); err != nil {
			return n, err
		}
		perPod[row.Pod] += len(row.IPs)
		n++
	}
	return n, errors.Join(errs...)
}

// readBounded reads a file of at most maxCheckpoint bytes; nil if there is
// none.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCheckpoint+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxCheckpoint {
		return nil, fmt.Errorf("%s: over %d bytes", path, maxCheckpoint)
	}
	return data, nil
}

// journal appends the rows whose addresses grew, a line each, before their
// answer is released.
func (l *learner) journal(rows []*endpoints.DNSName) {
	if len(rows) == 0 {
		return
	}
	var buf bytes.Buffer
	for _, r := range rows {
		b, err := json.Marshal(r)
		if err != nil {
			continue
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	l.journalMu.Lock()
	defer l.journalMu.Unlock()
	if l.journalFile == nil {
		return
	}
	if _, err := l.journalFile.Write(buf.Bytes()); err != nil {
		l.log.Warn("Could not append to the journal of policy-fqdn: a restart may forget the answer", "error", err)
	}
}

// openJournal opens the journal for appending (0600).
func (l *learner) openJournal(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, journalName), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	l.journalMu.Lock()
	l.journalFile = f
	l.journalMu.Unlock()
	return nil
}

// validRow is the row as this package writes it, without its expired
// addresses; nil if it is not such a row or holds nothing left.
func validRow(r *endpoints.DNSName, now time.Time, maxIPs int) *endpoints.DNSName {
	if r == nil || !r.Pod.IsValid() || r.Pod.Is4In6() || r.PodName == "" {
		return nil
	}
	if name, err := endpoints.ParseDomainName(r.Name); err != nil || name != r.Name || r.Name[0] == '*' {
		return nil
	}
	out := &endpoints.DNSName{Pod: r.Pod, PodName: r.PodName, Name: r.Name, Rules: r.Rules}
	for _, ip := range r.IPs {
		if ip.IP.IsValid() && !ip.IP.Is4In6() && ip.Expires.After(now) && !ip.Expires.After(now.Add(maxLife)) {
			out.IPs = append(out.IPs, ip)
		}
	}
	if len(out.IPs) == 0 || len(out.IPs) > maxIPs {
		return nil
	}
	return out
}

// writeCheckpoints writes the snapshot whenever policy-fqdn changes, at
// most once every checkpointEvery, and empties the journal, until ctx is
// done.
func (l *learner) writeCheckpoints(dir string) func(context.Context, cell.Health) error {
	path := filepath.Join(dir, checkpointName)
	return func(ctx context.Context, h cell.Health) error {
		defer func() {
			l.journalMu.Lock()
			if l.journalFile != nil {
				l.journalFile.Close()
				l.journalFile = nil
			}
			l.journalMu.Unlock()
		}()
		var last statedb.Revision
		for {
			// The journal's lock first: a row appended before it is in
			// the table, and so in this snapshot; one after goes to the
			// emptied journal.
			l.journalMu.Lock()
			txn := l.db.ReadTxn()
			rows, watch := l.names.AllWatch(txn)
			if rev := l.names.Revision(txn); rev != last {
				err := writeCheckpoint(path, statedb.Collect(rows))
				if err == nil && l.journalFile != nil {
					err = l.journalFile.Truncate(0)
				}
				if err != nil {
					h.Degraded("Checkpoint of policy-fqdn", err)
				} else {
					h.OK(fmt.Sprintf("Checkpoint %s written", path))
					last = rev
				}
			}
			l.journalMu.Unlock()
			select {
			case <-ctx.Done():
				return nil
			case <-watch:
			}
			select {
			case <-ctx.Done():
			case <-time.After(checkpointEvery):
			}
		}
	}
}

// writeCheckpoint replaces the file (0600) with the rows: a temporary
// file, synced, renamed over it.
func writeCheckpoint(path string, rows []*endpoints.DNSName) error {
	if rows == nil {
		rows = []*endpoints.DNSName{}
	}
	data, err := json.Marshal(checkpoint{Version: checkpointVersion, Names: rows})
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+checkpointName+".tmp-*")
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // gone once renamed
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return nil
}
