package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"

	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/ipam/allocations"
)

// usedReporter writes the pod allocations into the CiliumNode's
// status.ipam.used (IP -> {owner, resource: the ENI}), as Cilium's agent does
// in ENI mode, so that the operator never releases an IP in use.
//
// It writes only once ipam-allocations is initialized (the checkpoint
// restored), so a restarted agent never reports an empty set. It writes
// after every change of the allocations and re-checks every resync period
// (a re-created CiliumNode gets the list again). Update conflicts are
// retried at once (retry.RetryOnConflict); other errors make health
// Degraded and are retried with backoff.
type usedReporter struct {
	client   *k8sclient.Client
	log      *slog.Logger
	db       *statedb.DB
	allocs   statedb.Table[*allocations.Allocation]
	resync   time.Duration
	retryMin time.Duration
	retryMax time.Duration
}

// usedOf is status.ipam.used for the allocations.
func usedOf(txn statedb.ReadTxn, allocs statedb.Table[*allocations.Allocation]) map[string]any {
	used := map[string]any{}
	for a := range allocs.All(txn) {
		used[a.IP.String()] = map[string]any{"owner": a.Owner, "resource": a.ENI}
	}
	return used
}

func (r *usedReporter) run(ctx context.Context, health cell.Health) error {
	node := r.client.NodeName()
	// Wait for the checkpoint.
	for {
		ok, initWatch := r.allocs.Initialized(r.db.ReadTxn())
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-initWatch:
		}
	}
	backoff := r.retryMin
	var last map[string]any
	for {
		rtxn := r.db.ReadTxn()
		_, watch := r.allocs.AllWatch(rtxn)
		used := usedOf(rtxn, r.allocs)
		wait := r.resync
		switch written, err := r.write(ctx, used); {
		case ctx.Err() != nil:
			return nil
		case apierrors.IsNotFound(err):
			health.OK(fmt.Sprintf("waiting for CiliumNode %s to report %d allocations in status.ipam.used", node, len(used)))
			wait, backoff = backoff, min(2*backoff, r.retryMax)
		case err != nil:
			r.log.Warn("Cannot write status.ipam.used, retrying", "node", node, "error", err)
			health.Degraded(fmt.Sprintf("cannot write status.ipam.used of ciliumnodes/%s, retrying in %s", node, backoff), err)
			wait, backoff = backoff, min(2*backoff, r.retryMax)
		default:
			backoff = r.retryMin
			if written || !maps.EqualFunc(used, last, reflect.DeepEqual) {
				r.log.Info("Reported allocations in the CiliumNode", "node", node, "ips", len(used), "written", written)
			}
			last = used
			health.OK(fmt.Sprintf("%d IPs in status.ipam.used of ciliumnodes/%s", len(used), node))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-time.After(wait):
		}
	}
}

// write makes status.ipam.used equal to used, retrying update conflicts. It
// reports whether it changed the object.
func (r *usedReporter) write(ctx context.Context, used map[string]any) (bool, error) {
	nodes := r.client.Dynamic().Resource(k8sclient.CiliumNodes)
	written := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := nodes.Get(ctx, r.client.NodeName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur, _, _ := unstructured.NestedFieldNoCopy(obj.Object, "status", "ipam", "used")
		if curMap, ok := cur.(map[string]any); (ok && reflect.DeepEqual(curMap, used)) || (cur == nil && len(used) == 0) {
			return nil
		}
		if err := unstructured.SetNestedField(obj.Object, used, "status", "ipam", "used"); err != nil {
			return err
		}
		if _, err := nodes.UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
			return err
		}
		written = true
		return nil
	})
	return written, err
}
