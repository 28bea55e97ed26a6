package allocator

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/test/k8stest"
)

// TestK8sReportUsed: the allocations appear in the CiliumNode's
// status.ipam.used once ipam-allocations is initialized, and follow it.
func TestK8sReportUsed(t *testing.T) {
	c := k8stest.Start(t)
	sample := k8stest.DecodeFile(t, "../../test/testdata/samples/ciliumnode.yaml")[0]
	client, err := k8sclient.NewClient(k8sclient.Config{K8sKubeconfigPath: c.Kubeconfig, K8sNodeName: sample.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	db := statedb.New()
	allocs, err := allocations.NewAllocationTable(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(allocs)
	initDone := allocs.RegisterInitializer(wtxn, "ipam-checkpoint")
	allocs.Insert(wtxn, &allocations.Allocation{IP: netip.MustParseAddr("10.130.100.133"), Owner: "shop/web-0", ENI: "eni-0a1b2c3d4e5f00001", State: allocations.StateRestored})
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
	celltest.Eventually(t, "status.ipam.used after restore", func() (bool, string) {
		m, s := used()
		return reflect.DeepEqual(m, want), s + " / " + health.Get()
	})

	// A pod allocated: it appears.
	wtxn = db.WriteTxn(allocs)
	allocs.Insert(wtxn, &allocations.Allocation{IP: netip.MustParseAddr("10.130.112.20"), Owner: "shop/db-0", ENI: "eni-0a1b2c3d4e5f00002", State: allocations.StateAllocated})
	wtxn.Commit()
	want["10.130.112.20"] = map[string]any{"owner": "shop/db-0", "resource": "eni-0a1b2c3d4e5f00002"}
	celltest.Eventually(t, "a new allocation reported", func() (bool, string) {
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
	celltest.Eventually(t, "status.ipam.used restored by the resync", func() (bool, string) {
		m, s := used()
		return reflect.DeepEqual(m, want), s + " / " + health.Get()
	})
	if h := health.Get(); h != "OK: 2 IPs in status.ipam.used of ciliumnodes/"+sample.GetName() {
		t.Errorf("health %q", h)
	}
}
