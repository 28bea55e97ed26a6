package fqdn

import (
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// The snapshot and the journal come back: the journal's later rows replace
// the snapshot's, expired addresses, rows that are not this package's and a
// torn last line are dropped, the per-pod cap holds.
func TestCheckpointRestore(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := netip.MustParseAddr("10.0.0.2")
	row := func(name string, ips ...string) *endpoints.DNSName {
		r := &endpoints.DNSName{Pod: pod, PodName: "ns/a", Name: name}
		for _, ip := range ips {
			r.IPs = append(r.IPs, endpoints.NameIP{IP: netip.MustParseAddr(ip), Expires: now.Add(time.Hour)})
		}
		return r
	}
	expired := row("old.example.com", "192.0.2.9")
	expired.IPs[0].Expires = now.Add(-time.Second)
	bad := row("not a name", "192.0.2.8")
	if err := writeCheckpoint(filepath.Join(dir, checkpointName), []*endpoints.DNSName{row("a.example.com", "192.0.2.1"), expired, bad, row("big.example.com", "192.0.2.20", "192.0.2.21", "192.0.2.22")}); err != nil {
		t.Fatal(err)
	}

	db := statedb.New()
	names, err := endpoints.NewDNSNamesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	l := &learner{log: slog.New(slog.DiscardHandler), db: db, names: names, now: func() time.Time { return now },
		settings: Settings{MaxIPsPerName: 10, MaxIPsPerPod: 4}}
	if err := l.openJournal(dir); err != nil {
		t.Fatal(err)
	}
	l.journal([]*endpoints.DNSName{row("a.example.com", "192.0.2.1", "192.0.2.2"), row("b.example.com", "192.0.2.3")})
	l.journalFile.Close()
	f, _ := os.OpenFile(filepath.Join(dir, journalName), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"Pod":"10.0.0.2","PodName":"ns/a","Na`) // torn
	f.Close()

	wtxn := db.WriteTxn(names)
	n, err := l.restore(wtxn, dir)
	wtxn.Commit()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for r := range names.All(db.ReadTxn()) {
		got[r.Name] = len(r.IPs)
	}
	// a (2, the journal's), then big (3) is over the cap of 4, b (1).
	want := map[string]int{"a.example.com": 2, "b.example.com": 1}
	if n != len(want) || len(got) != len(want) || got["a.example.com"] != 2 || got["b.example.com"] != 1 {
		t.Errorf("restored %d: %v, want %v", n, got, want)
	}
	if fi, err := os.Stat(filepath.Join(dir, checkpointName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("snapshot mode: %v %v", fi.Mode(), err)
	}
}
