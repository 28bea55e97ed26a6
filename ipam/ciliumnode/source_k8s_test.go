package ciliumnode

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/test/k8stest"
)

func eniRows(db *statedb.DB, table statedb.Table[*ENI]) []*ENI {
	var out []*ENI
	for e := range table.All(db.ReadTxn()) {
		out = append(out, e)
	}
	return out
}

func sameENIs(a, b []*ENI) bool {
	if len(a) != len(b) {
		return false
	}
	byID := map[string]*ENI{}
	for _, e := range a {
		byID[e.ID] = e
	}
	for _, e := range b {
		if o, ok := byID[e.ID]; !ok || !o.Equal(e) {
			return false
		}
	}
	return true
}

func describeENIs(enis []*ENI) string {
	var parts []string
	for _, e := range enis {
		parts = append(parts, fmt.Sprintf("%s(#%d pool %v)", e.ID, e.Number, e.Pool))
	}
	return strings.Join(parts, " ")
}

// TestK8sCiliumNodeSource runs the API-backed CiliumNode source against a
// real API server: the object created gives the same enis rows as the same
// object read from a file (one parser), an address added grows the pool, and
// the object deleted keeps the rows with health Degraded.
func TestK8sCiliumNodeSource(t *testing.T) {
	const samplePath = "../../test/testdata/samples/ciliumnode.yaml"
	c := k8stest.Start(t)
	sample := k8stest.DecodeFile(t, samplePath)[0]
	node := sample.GetName()
	client, err := k8sclient.NewClient(k8sclient.Config{K8sKubeconfigPath: c.Kubeconfig, K8sNodeName: node})
	if err != nil {
		t.Fatal(err)
	}
	fromFile, err := ReadCiliumNodeFile(samplePath)
	if err != nil {
		t.Fatal(err)
	}

	db := statedb.New()
	table, err := NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(table)
	initDone := table.RegisterInitializer(wtxn, "ciliumnode")
	wtxn.Commit()
	log := hivetest.Logger(t, hivetest.LogLevel(slog.LevelDebug))
	src := newK8sSource(sourceParams{Log: log, DB: db, Table: table, Metrics: &sourceMetrics{}, Client: client}, initDone)
	health := &celltest.Health{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); src.run(ctx, health) }()
	t.Cleanup(func() { cancel(); <-done })

	initialized := func() bool { ok, _ := table.Initialized(db.ReadTxn()); return ok }

	// No object yet: waiting, uninitialized, no rows.
	celltest.Eventually(t, "waiting for the CiliumNode", func() (bool, string) {
		h := health.Get()
		return strings.HasPrefix(h, "OK: waiting for CiliumNode "+node), h
	})
	if initialized() || len(eniRows(db, table)) != 0 {
		t.Fatal("table initialized or filled without a CiliumNode")
	}

	// Created: the same rows as from the file.
	c.MustApply(t, sample)
	celltest.Eventually(t, "enis rows from the API", func() (bool, string) {
		rows := eniRows(db, table)
		return initialized() && sameENIs(rows, fromFile.ENIs), describeENIs(rows) + " / " + health.Get()
	})
	if h := health.Get(); h != "OK: "+fromFile.Summary() {
		t.Fatalf("health %q, want OK: %s", h, fromFile.Summary())
	}

	// An address added to ENI 1: the pool grows.
	grown := sample.DeepCopy()
	pool, _, _ := unstructured.NestedMap(grown.Object, "spec", "ipam", "pool")
	pool["10.130.100.136"] = map[string]any{"resource": "eni-0a1b2c3d4e5f00001"}
	if err := unstructured.SetNestedMap(grown.Object, pool, "spec", "ipam", "pool"); err != nil {
		t.Fatal(err)
	}
	c.MustApply(t, grown)
	want := fromFile.PoolSize() + 1
	poolSize := func() int {
		return (&CiliumNode{ENIs: eniRows(db, table)}).PoolSize()
	}
	celltest.Eventually(t, "pool grows", func() (bool, string) {
		return poolSize() == want, describeENIs(eniRows(db, table))
	})
	before := eniRows(db, table)

	// Deleted: the rows stay, health Degraded.
	ctxDel, cancelDel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelDel()
	if err := c.Delete(ctxDel, sample); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "Degraded after delete", func() (bool, string) {
		h := health.Get()
		return strings.HasPrefix(h, "Degraded: CiliumNode deleted, keeping the last ENIs"), h
	})
	if rows := eniRows(db, table); !sameENIs(rows, before) || poolSize() != want {
		t.Fatalf("rows changed after the delete: %s", describeENIs(rows))
	}

	// Re-created: back to OK with the object's rows.
	c.MustApply(t, sample)
	celltest.Eventually(t, "OK after re-create", func() (bool, string) {
		rows := eniRows(db, table)
		return sameENIs(rows, fromFile.ENIs) && strings.HasPrefix(health.Get(), "OK: "), describeENIs(rows) + " / " + health.Get()
	})

	// API server away: rows kept, Degraded; back: OK.
	c.StopAPIServer(t)
	celltest.Eventually(t, "Degraded while the API server is away", func() (bool, string) {
		h := health.Get()
		return strings.HasPrefix(h, "Degraded: CiliumNode "+node+": API server error, keeping the last ENIs"), h
	})
	if rows := eniRows(db, table); !sameENIs(rows, fromFile.ENIs) {
		t.Fatalf("rows changed during the outage: %s", describeENIs(rows))
	}
	c.StartAPIServer(t)
	celltest.Eventually(t, "OK after the outage", func() (bool, string) {
		h := health.Get()
		return h == "OK: "+fromFile.Summary(), h
	})
}

func TestCiliumNodeSourceConflict(t *testing.T) {
	kubeconfig := k8stest.UnreachableKubeconfig(t)
	enabled, err := k8sclient.NewClient(k8sclient.Config{K8sKubeconfigPath: kubeconfig, K8sNodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	def := Settings{Path: DefaultPath}
	explicit := Settings{Path: "/tmp/ciliumnode.yaml"}
	for _, tc := range []struct {
		name   string
		cfg    Settings
		client *k8sclient.Client
		err    string
	}{
		{"no client", explicit, nil, ""},
		{"default path with the API", def, enabled, ""},
		{"explicit path with the API", explicit, enabled, "--ciliumnode-path /tmp/ciliumnode.yaml is set and the Kubernetes API server is enabled (kubeconfig " + kubeconfig + ")"},
	} {
		err := checkSource(tc.cfg, tc.client)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.err)
		}
	}
}
