package ipam

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/test/k8stest"
)

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached; last state: %s", what, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

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
	const samplePath = "../test/testdata/samples/ciliumnode.yaml"
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
	table, err := NewENITable(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(table)
	initDone := table.RegisterInitializer(wtxn, "ciliumnode")
	wtxn.Commit()
	log := hivetest.Logger(t, hivetest.LogLevel(slog.LevelDebug))
	src := newK8sSource(sourceParams{Log: log, DB: db, Table: table, Metrics: &ipamMetrics{}, Client: client}, initDone)
	health := &celltest.Health{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); src.run(ctx, health) }()
	t.Cleanup(func() { cancel(); <-done })

	initialized := func() bool { ok, _ := table.Initialized(db.ReadTxn()); return ok }

	// No object yet: waiting, uninitialized, no rows.
	eventually(t, "waiting for the CiliumNode", func() (bool, string) {
		h := health.Get()
		return strings.HasPrefix(h, "OK: waiting for CiliumNode "+node), h
	})
	if initialized() || len(eniRows(db, table)) != 0 {
		t.Fatal("table initialized or filled without a CiliumNode")
	}

	// Created: the same rows as from the file.
	c.MustApply(t, sample)
	eventually(t, "enis rows from the API", func() (bool, string) {
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
	eventually(t, "pool grows", func() (bool, string) {
		return poolSize() == want, describeENIs(eniRows(db, table))
	})
	before := eniRows(db, table)

	// Deleted: the rows stay, health Degraded.
	ctxDel, cancelDel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelDel()
	if err := c.Delete(ctxDel, sample); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Degraded after delete", func() (bool, string) {
		h := health.Get()
		return strings.HasPrefix(h, "Degraded: CiliumNode deleted, keeping the last ENIs"), h
	})
	if rows := eniRows(db, table); !sameENIs(rows, before) || poolSize() != want {
		t.Fatalf("rows changed after the delete: %s", describeENIs(rows))
	}

	// Re-created: back to OK with the object's rows.
	c.MustApply(t, sample)
	eventually(t, "OK after re-create", func() (bool, string) {
		rows := eniRows(db, table)
		return sameENIs(rows, fromFile.ENIs) && strings.HasPrefix(health.Get(), "OK: "), describeENIs(rows) + " / " + health.Get()
	})

	// API server away: rows kept, Degraded; back: OK.
	c.StopAPIServer(t)
	eventually(t, "Degraded while the API server is away", func() (bool, string) {
		h := health.Get()
		return strings.HasPrefix(h, "Degraded: CiliumNode "+node+": API server error, keeping the last ENIs"), h
	})
	if rows := eniRows(db, table); !sameENIs(rows, fromFile.ENIs) {
		t.Fatalf("rows changed during the outage: %s", describeENIs(rows))
	}
	c.StartAPIServer(t)
	eventually(t, "OK after the outage", func() (bool, string) {
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
	explicit := DefaultConfig
	explicit.CiliumNodePath = "/tmp/ciliumnode.yaml"
	for _, tc := range []struct {
		name   string
		cfg    Config
		client *k8sclient.Client
		err    string
	}{
		{"no client", explicit, nil, ""},
		{"default path with the API", DefaultConfig, enabled, ""},
		{"explicit path with the API", explicit, enabled, "--ciliumnode-path /tmp/ciliumnode.yaml is set and the Kubernetes API server is enabled (kubeconfig " + kubeconfig + ")"},
	} {
		err := checkCiliumNodeSource(tc.cfg, tc.client)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.err)
		}
	}
}

// TestK8sReportUsed: the allocations appear in the CiliumNode's
// status.ipam.used once ipam-allocations is initialized, and follow it.
func TestK8sReportUsed(t *testing.T) {
	c := k8stest.Start(t)
	sample := k8stest.DecodeFile(t, "../test/testdata/samples/ciliumnode.yaml")[0]
	client, err := k8sclient.NewClient(k8sclient.Config{K8sKubeconfigPath: c.Kubeconfig, K8sNodeName: sample.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	db := statedb.New()
	allocs, err := NewAllocationTable(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(allocs)
	initDone := allocs.RegisterInitializer(wtxn, "ipam-checkpoint")
	allocs.Insert(wtxn, &Allocation{IP: netip.MustParseAddr("10.130.100.133"), Owner: "shop/web-0", ENI: "eni-0a1b2c3d4e5f00001", State: StateRestored})
	wtxn.Commit()

	health := &celltest.Health{}
	r := &usedReporter{client: client, log: hivetest.Logger(t), db: db, allocs: allocs,
		resync: 200 * time.Millisecond, retryMin: 50 * time.Millisecond, retryMax: 200 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.run(ctx, health) }()
	t.Cleanup(func() { cancel(); <-done })

	used := func() (map[string]any, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		obj, err := c.Get(ctx, sample)
		if err != nil {
			return nil, err.Error()
		}
		m, _, _ := unstructured.NestedMap(obj.Object, "status", "ipam", "used")
		return m, fmt.Sprint(m)
	}

	// No CiliumNode yet; then the checkpoint is not restored: nothing written.
	c.MustApply(t, sample)
	time.Sleep(500 * time.Millisecond)
	if m, s := used(); len(m) != 0 {
		t.Fatalf("written before ipam-allocations was initialized: %s", s)
	}

	wtxn = db.WriteTxn(allocs)
	initDone(wtxn)
	wtxn.Commit()
	want := map[string]any{"10.130.100.133": map[string]any{"owner": "shop/web-0", "resource": "eni-0a1b2c3d4e5f00001"}}
	eventually(t, "status.ipam.used after restore", func() (bool, string) {
		m, s := used()
		return reflect.DeepEqual(m, want), s + " / " + health.Get()
	})

	// A pod allocated: it appears.
	wtxn = db.WriteTxn(allocs)
	allocs.Insert(wtxn, &Allocation{IP: netip.MustParseAddr("10.130.112.20"), Owner: "shop/db-0", ENI: "eni-0a1b2c3d4e5f00002", State: StateAllocated})
	wtxn.Commit()
	want["10.130.112.20"] = map[string]any{"owner": "shop/db-0", "resource": "eni-0a1b2c3d4e5f00002"}
	eventually(t, "a new allocation reported", func() (bool, string) {
		m, s := used()
		return reflect.DeepEqual(m, want), s + " / " + health.Get()
	})

	// Another client clears the status (as a re-created object would have
	// none): the next resync writes it again.
	ctxU, cancelU := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelU()
	nodes := c.Dynamic().Resource(k8sclient.CiliumNodes)
	obj, err := nodes.Get(ctxU, sample.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unstructured.RemoveNestedField(obj.Object, "status", "ipam", "used")
	if _, err := nodes.UpdateStatus(ctxU, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "status.ipam.used restored by the resync", func() (bool, string) {
		m, s := used()
		return reflect.DeepEqual(m, want), s + " / " + health.Get()
	})
	if h := health.Get(); h != "OK: 2 IPs in status.ipam.used of ciliumnodes/"+sample.GetName() {
		t.Errorf("health %q", h)
	}
}
