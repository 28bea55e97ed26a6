package source

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/nodeips"
)

// ClusterPolicyEndpoints is the resource of ClusterPolicyEndpoints:
// cluster-scoped, read whole (the ClusterRole of
// Documentation/deploy/network-policy grants get, list and watch).
var ClusterPolicyEndpoints = schema.GroupVersionResource{Group: "networking.k8s.aws", Version: "v1alpha1", Resource: "clusterpolicyendpoints"}

// clusterK8sSource keeps cluster-policy-endpoints equal to the
// ClusterPolicyEndpoints in the API server, restricted to the pods on this
// node by the node rule of policyK8sSource (a pod entry is this node's when
// its hostIP is one of this node's addresses; an object left without pods
// is ignored).
//
// Each object goes through the parser and validator of a file
// (parseClusterObject, on its JSON) and fails closed as a file does
// (recover_cluster.go): an invalid object keeps its last good version, and
// without one is replaced by its stand-in, which denies the pods it names
// everything but their node (a pod whose hostIP cannot be read is kept: it
// may be this node's); health is Degraded, naming the object, field and
// value. An API error leaves the table as it is (Degraded, retried by the
// informer's backoff), but for one: while no ClusterPolicyEndpoint was ever
// seen, a resource the API server does not serve (its CRD is not installed:
// NotFound) holds none, and the table is initialized empty, so that a
// cluster without ClusterNetworkPolicies enforces its NetworkPolicies; once
// the CRD is installed the informer's relist finds its objects. The table
// is initialized once the informer has synced (or so), whatever the objects
// hold.
type clusterK8sSource struct {
	*filesource.Source[*ClusterPolicyEndpoint, string]
	dir     *policySource // the node configuration, the period
	client  *k8sclient.Client
	nodeIPs statedb.Table[*nodeips.NodeIP]

	mu       sync.Mutex
	objects  filesource.Parts[*clusterObject] // last good version, by name
	last     k8sclient.Snapshot
	haveLast bool
	seen     bool // an object was ever seen
}

// clusterObject is the last good version of one object, unfiltered.
type clusterObject struct {
	resourceVersion string
	cpe             *ClusterPolicyEndpoint
}

func newClusterK8sSource(s *policySource, client *k8sclient.Client, nodeIPs statedb.Table[*nodeips.NodeIP]) *clusterK8sSource {
	s.cluster.Failure = filesource.Always(clusterAPIFailure("invalid ClusterPolicyEndpoints, keeping their last good versions"))
	s.cluster.ValidAgain = filesource.Line{Msg: "ClusterPolicyEndpoints are valid and the API server answers again"}
	return &clusterK8sSource{Source: s.cluster, dir: s, client: client, nodeIPs: nodeIPs}
}

func (s *clusterK8sSource) run(ctx context.Context, health cell.Health) {
	s.Log.Info("Watching ClusterPolicyEndpoints in the API server", "node", s.client.NodeName(), "api-server", s.client.Host())
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		defer close(done)
		// The node's addresses change without an event: re-evaluate on
		// every change of node-ips and every resync (as policyK8sSource).
		t := time.NewTicker(s.dir.Period())
		defer t.Stop()
		for {
			txn := s.DB.ReadTxn()
			_, addrsChanged := s.nodeIPs.AllWatch(txn)
			var initialized <-chan struct{}
			if ok, watch := s.nodeIPs.Initialized(txn); !ok {
				initialized = watch
			}
			select {
			case <-ctx.Done():
				return
			case <-addrsChanged:
			case <-initialized:
			case <-t.C:
			}
			s.mu.Lock()
			if s.haveLast {
				s.updateLocked(health, s.last)
			}
			s.mu.Unlock()
		}
	}()
	s.client.Watch(ctx, ClusterPolicyEndpoints, "", nil, func(snap k8sclient.Snapshot) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.last, s.haveLast = snap, true
		s.updateLocked(health, snap)
	})
}

func (s *clusterK8sSource) updateLocked(health cell.Health, snap k8sclient.Snapshot) {
	s.seen = s.seen || len(snap.Objects) > 0
	notServed := false
	switch {
	case snap.Err != nil && apierrors.IsNotFound(snap.Err) && !s.seen:
		notServed = true
	case snap.Err != nil:
		s.Fail(health, snap.Err, clusterAPIFailure("API server error, keeping the ClusterPolicyEndpoints as they are, retrying"))
		return
	}
	addrs, err := nodeAddresses(s.DB, s.nodeIPs)
	if err != nil {
		s.Fail(health, err, clusterAPIFailure("cannot tell the pods of this node, keeping the ClusterPolicyEndpoints as they are"))
		return
	}
	byName := make(map[string]*unstructured.Unstructured, len(snap.Objects))
	names := make([]string, 0, len(snap.Objects))
	for _, obj := range snap.Objects {
		byName[obj.GetName()] = obj
		names = append(names, obj.GetName())
	}
	var invalidMu sync.Mutex
	invalid := map[string]*clusterObject{} // what an object in error puts in force
	current, _, errs := s.objects.Read(names, func(name string, last *clusterObject) (*clusterObject, error) {
		obj := byName[name]
		if last != nil && last.resourceVersion == obj.GetResourceVersion() {
			return last, nil
		}
		cpe, err := parseClusterAPIObject(name, obj.Object)
		if err != nil {
			var lastGood []*ClusterPolicyEndpoint
			if last != nil {
				lastGood = []*ClusterPolicyEndpoint{last.cpe}
			}
			stand := recoverClusterAPIObject(name, obj.Object, err)
			invalidMu.Lock()
			invalid[name] = &clusterObject{cpe: resolveClusters([]parsedObject{{cpe: stand, err: err}}, lastGood)[0]}
			invalidMu.Unlock()
			return nil, err
		}
		return &clusterObject{resourceVersion: obj.GetResourceVersion(), cpe: cpe}, nil
	})
	current = maps.Clone(current) // Parts' own map holds the good versions only
	maps.Copy(current, invalid)

	all := make(map[string]*ClusterPolicyEndpoint, len(current))
	for name, obj := range current {
		all[name] = obj.cpe
	}
	desired := onThisNode(all, func(cpe *ClusterPolicyEndpoint) *ClusterPolicyEndpoint { return clusterPodsOnNode(cpe, addrs) },
		func(cpe *ClusterPolicyEndpoint, pods []PodEndpoint) { cpe.Pods = pods })
	in := s.dir.clusterInput(desired, nil)
	in.Summary = fmt.Sprintf("%d ClusterPolicyEndpoints for the pods of this node, of %d in the API server", len(in.Rows), len(current))
	if notServed {
		in.Summary = "no ClusterPolicyEndpoints: the API server does not serve " + ClusterPolicyEndpoints.GroupResource().String() + " (its CRD is not installed)"
	}
	s.Update(health, in, joinErrors(errs))
}

// clusterAPIFailure reports a failure of the API source: reason says what
// stays.
func clusterAPIFailure(reason string) filesource.Failure {
	return filesource.Failure{Log: "ClusterPolicyEndpoints: " + reason, Health: "ClusterPolicyEndpoints: " + reason, Announce: true}
}

// parseClusterAPIObject runs one object from the API server through the
// file parser. Its File is "clusterpolicyendpoints/<name>".
func parseClusterAPIObject(name string, obj map[string]any) (*ClusterPolicyEndpoint, error) {
	return parseAPI("clusterpolicyendpoints/"+name, obj, parseClusterObject)
}

// recoverClusterAPIObject is the stand-in of an object of the API server
// that is not valid.
func recoverClusterAPIObject(name string, obj map[string]any, cause error) *ClusterPolicyEndpoint {
	return recoverClusterJSON("clusterpolicyendpoints/"+name, name, name, apiJSON(obj), cause)
}

// clusterPodsOnNode returns cpe with only the pods whose hostIP is in
// addrs, or nil when none is, as podsOnNode does for PolicyEndpoints: the
// pods of a stand-in whose hostIP cannot be read are kept.
func clusterPodsOnNode(cpe *ClusterPolicyEndpoint, addrs map[netip.Addr]bool) *ClusterPolicyEndpoint {
	return onNode(cpe, cpe.Pods, cpe.StandIn, addrs, func(c *ClusterPolicyEndpoint, pods []PodEndpoint) { c.Pods = pods })
}
