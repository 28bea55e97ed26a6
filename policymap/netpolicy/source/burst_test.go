package source

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/metrics"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// burstFile is a PolicyEndpoint of rules egress rules for one pod, as the
// 50k-rule benchmark writes them (test/policy_rules_bench_test.go).
func burstFile(name string, rules int, pod string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata:\n  name: %s\n  namespace: bench\n"+
		"spec:\n  policyRef:\n    name: %s\n  podIsolation: [Egress]\n  podSelectorEndpoints:\n  - hostIP: 10.255.0.1\n    podIP: %s\n  egress:\n", name, name, pod)
	for i := range rules {
		fmt.Fprintf(&b, "  - cidr: 10.%d.%d.%d/32\n    ports:\n    - protocol: TCP\n      port: %d\n", len(name)%200, byte(i>>8), byte(i), 1000+i)
	}
	return b.String()
}

// runningSource runs the directory source of dir on fresh tables.
func runningSource(t testing.TB, dir string) (*statedb.DB, statedb.RWTable[*PolicyEndpoint]) {
	t.Helper()
	db := statedb.New()
	pes, err := endpoints.NewPolicyEndpointsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	cpes, err := endpoints.NewClusterPolicyEndpointsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(pes, cpes)
	initDone, clusterInitDone := pes.RegisterInitializer(wtxn, "pe"), cpes.RegisterInitializer(wtxn, "cpe")
	wtxn.Commit()
	log := slog.New(slog.DiscardHandler)
	s := newPolicySource(Settings{Path: dir, Resync: time.Hour}, nodeconfig.Config{EnableIPv4: true}, newUnknownFieldsCounter(),
		newTable(policyEndpoints, filesource.Source[*PolicyEndpoint, string]{Log: log, DB: db, Table: pes, InitDone: initDone, Metrics: metrics.NewSource("pe")}),
		newTable(clusterPolicyEndpoints, filesource.Source[*ClusterPolicyEndpoint, string]{Log: log, DB: db, Table: cpes, InitDone: clusterInitDone, Metrics: metrics.NewSource("cpe")}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx, &celltest.Health{}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return db, pes
}

// smallDuringBurst writes 10 PolicyEndpoints of 5,000 rules (renamed in,
// concurrently), then a one-rule PolicyEndpoint, and returns how long the
// one-rule object took to be in policy-endpoints after its write, and how
// many of the 10 were in then.
func smallDuringBurst(t testing.TB) (time.Duration, int) {
	dir := filepath.Join(t.TempDir(), "pe")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	db, pes := runningSource(t, dir)
	var wg sync.WaitGroup
	for f := range 10 {
		wg.Go(func() {
			celltest.WriteFileAtomic(t, filepath.Join(dir, fmt.Sprintf("rules-%d.yaml", f)), burstFile(fmt.Sprintf("rules-%d", f), 5000, "10.250.0.5"))
		})
	}
	wg.Wait()
	start := time.Now()
	celltest.WriteFileAtomic(t, filepath.Join(dir, "one.yaml"), burstFile("one", 1, "10.250.0.6"))
	deadline := time.After(time.Minute)
	for {
		txn := db.ReadTxn()
		_, watch := pes.AllWatch(txn)
		if _, _, found := pes.Get(txn, endpoints.PolicyEndpointNameIndex.Query("bench/one")); found {
			return time.Since(start), pes.NumObjects(txn) - 1
		}
		select {
		case <-watch:
		case <-deadline:
			t.Fatal("the one-rule PolicyEndpoint is not in policy-endpoints after a minute")
		}
	}
}

// TestSmallFileIsNotHeldBehindABurst: a one-rule PolicyEndpoint written
// right after 10 of 5,000 rules is in policy-endpoints before the large
// ones are all parsed: files are applied as they are parsed.
func TestSmallFileIsNotHeldBehindABurst(t *testing.T) {
	took, big := smallDuringBurst(t)
	t.Logf("the one-rule PolicyEndpoint in policy-endpoints %s after its write, with %d of the 10 large ones", took, big)
	if big == 10 {
		t.Errorf("the one-rule PolicyEndpoint came in with all 10 large ones (after %s): held behind their parsing", took)
	}
}

// BenchmarkSmallFileDuringBurst: one-ms is how long the one-rule
// PolicyEndpoint takes to be in policy-endpoints after its write, written
// right after 10 of 5,000 rules (the source's part of the 50k-rule process
// benchmark's one-ms).
func BenchmarkSmallFileDuringBurst(b *testing.B) {
	var total time.Duration
	for range b.N {
		took, _ := smallDuringBurst(b)
		total += took
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "one-ms")
}
