package source

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/nodeips"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// apiSource keeps a kind's table equal to its objects in the API server
// (of all namespaces), restricted to the pods on this node.
//
// Node rule: a pod entry (spec.podSelectorEndpoints[]) is this node's when
// its hostIP is one of this node's addresses: an address of an interface of
// the agent's network namespace (loopback excluded), or the primary IP of
// one of the node's ENIs (the enis table, when the ENI IPAM runs). Entries
// without a hostIP, or of other nodes, are dropped; an object left without
// pods is ignored (not in the table), unless another slice of its policy
// has pods here: its rules are theirs too (onThisNode). The addresses are
// re-read on every change and every --policy-endpoints-resync-interval.
//
// Each object goes through the same parser and validator as a file (its
// kind's decode, on its JSON), and fails closed as a file does
// (recover.go): an invalid object keeps its last good version, and without
// one is replaced by its stand-in (a pod whose hostIP cannot be read is
// kept: it may be this node's); health is Degraded, naming the object,
// field and value. An API error leaves the table as it is (Degraded,
// retried by the informer's backoff), but for a resource the API server
// does not serve while no object was ever seen, when the kind's CRD is
// optional (kind.optionalCRD): the table is then initialized empty. The
// table is initialized once the informer has synced, whatever the objects
// hold.
type apiSource[R any, T row[R]] struct {
	*table[R, T]
	client  *k8sclient.Client
	nodeIPs statedb.Table[*nodeips.NodeIP]

	mu       sync.Mutex
	objects  filesource.Parts[*apiObject[T]] // last good version, by key
	last     k8sclient.Snapshot
	haveLast bool
	seen     bool // an object was ever seen
}

// apiObject is the last good version of one object, unfiltered.
type apiObject[T any] struct {
	resourceVersion string
	row             T
}

func (t *table[R, T]) watchAPI(ctx context.Context, health cell.Health, client *k8sclient.Client, nodeIPs statedb.Table[*nodeips.NodeIP]) {
	t.Failure = filesource.Always(t.apiFailure("invalid " + t.kind.plural() + ", keeping their last good versions"))
	t.ValidAgain = filesource.Line{Msg: t.kind.plural() + " are valid and the API server answers again"}
	s := &apiSource[R, T]{table: t, client: client, nodeIPs: nodeIPs}
	s.run(ctx, health)
}

func (s *apiSource[R, T]) run(ctx context.Context, health cell.Health) {
	s.Log.Info("Watching "+s.kind.plural()+" in the API server", "node", s.client.NodeName(), "api-server", s.client.Host())
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		defer close(done)
		// The node's addresses change without an event: re-evaluate on
		// every change of node-ips and every resync.
		t := time.NewTicker(s.Period())
		defer t.Stop()
		for {
			txn := s.DB.ReadTxn()
			_, addrsChanged := s.nodeIPs.AllWatch(txn)
			var initialized <-chan struct{} // nil (never ready) once initialized
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
	s.client.Watch(ctx, s.kind.resource, "", nil, func(snap k8sclient.Snapshot) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.last, s.haveLast = snap, true
		s.updateLocked(health, snap)
	})
}

// nodeAddresses is the set of this node's addresses in nodeIPs (see the
// node rule), once it is initialized: before that, no pod can be said not
// to be this node's.
func nodeAddresses(db *statedb.DB, nodeIPs statedb.Table[*nodeips.NodeIP]) (map[netip.Addr]bool, error) {
	txn := db.ReadTxn()
	if ok, _ := nodeIPs.Initialized(txn); !ok {
		return nil, fmt.Errorf("waiting for the %s table (pending: %v)", nodeips.TableName, nodeIPs.PendingInitializers(txn))
	}
	return nodeips.Set(txn, nodeIPs), nil
}

func (s *apiSource[R, T]) updateLocked(health cell.Health, snap k8sclient.Snapshot) {
	k := s.kind
	s.seen = s.seen || len(snap.Objects) > 0
	notServed := false
	switch {
	case snap.Err != nil && k.optionalCRD && apierrors.IsNotFound(snap.Err) && !s.seen:
		notServed = true
	case snap.Err != nil:
		s.Fail(health, snap.Err, s.apiFailure("API server error, keeping the "+k.plural()+" as they are, retrying"))
		return
	}
	addrs, err := nodeAddresses(s.DB, s.nodeIPs)
	if err != nil {
		s.Fail(health, err, s.apiFailure("cannot tell the pods of this node, keeping the "+k.plural()+" as they are"))
		return
	}
	byKey := make(map[string]*unstructured.Unstructured, len(snap.Objects))
	keys := make([]string, 0, len(snap.Objects))
	for _, obj := range snap.Objects {
		key := k.apiKey(obj)
		byKey[key] = obj
		keys = append(keys, key)
	}
	var invalidMu sync.Mutex
	invalid := map[string]*apiObject[T]{} // what an object in error puts in force
	current, _, errs := s.objects.Read(keys, func(key string, last *apiObject[T]) (*apiObject[T], error) {
		obj := byKey[key]
		if last != nil && last.resourceVersion == obj.GetResourceVersion() {
			return last, nil
		}
		o, err := k.parseAPI(key, obj.Object)
		if err != nil {
			var lastGood []T
			if last != nil {
				lastGood = []T{last.row}
			}
			stand, _ := k.recover(k.apiFile(key), key, key, apiJSON(obj.Object), err)
			invalidMu.Lock()
			invalid[key] = &apiObject[T]{row: k.resolve([]parsedObject{{kind: k, row: stand, err: err}}, lastGood)[0]}
			invalidMu.Unlock()
			return nil, err
		}
		return &apiObject[T]{resourceVersion: obj.GetResourceVersion(), row: o}, nil
	})
	current = maps.Clone(current) // Parts' own map holds the good versions only
	maps.Copy(current, invalid)

	all := make(map[string]T, len(current))
	for key, obj := range current {
		all[key] = obj.row
	}
	desired := onThisNode(all, func(o T) T { return podsOnNode(o, addrs) })
	in := s.input(desired, nil)
	in.Summary = fmt.Sprintf("%d %s for the pods of this node, of %d in the API server", len(in.Rows), k.plural(), len(current))
	if notServed {
		in.Summary = "no " + k.plural() + ": the API server does not serve " + k.resource.GroupResource().String() + " (its CRD is not installed)"
	}
	s.Update(health, in, joinErrors(errs))
}

// apiFailure reports a failure of the API source: reason says what stays.
func (t *table[R, T]) apiFailure(reason string) filesource.Failure {
	return filesource.Failure{Log: t.kind.plural() + ": " + reason, Health: t.kind.plural() + ": " + reason, Announce: true}
}

// apiKey is the key of an object of the API server: "namespace/name", or
// its name when the kind is cluster-scoped.
func (k *kind[R, T]) apiKey(obj *unstructured.Unstructured) string {
	if k.namespaced {
		return obj.GetNamespace() + "/" + obj.GetName()
	}
	return obj.GetName()
}

// parseAPI runs an object of the API server, by its key, through the file
// parser (at the root of the document: no field path). Its File is
// "<resource>/<key>" ("policyendpoints/<namespace>/<name>").
func (k *kind[R, T]) parseAPI(key string, obj map[string]any) (T, error) {
	var zero T
	file := k.apiFile(key)
	data, err := json.Marshal(obj)
	var out T
	if err == nil {
		out, err = k.decode(file, nil, data)
	}
	if err != nil {
		return zero, fmt.Errorf("%s: %w", file, err)
	}
	return out, nil
}

// apiJSON is an object of the API server as JSON for a stand-in: nil (no
// pods can be read) if it does not marshal.
func apiJSON(obj map[string]any) []byte {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil
	}
	return data
}

// onThisNode returns the objects of all (by key) that this node enforces:
// each with only its pods on this node (local: nil when none), and of
// those with none, the slices of a policy that another slice gives pods
// here, without pods (on a copy): a policy is the union of its slices
// (endpoints.Union), so their rules are those pods' too.
func onThisNode[R any, T row[R]](all map[string]T, local func(T) T) map[string]T {
	out := make(map[string]T, len(all))
	parents := map[string]bool{}
	for key, o := range all {
		if l := local(o); l != nil {
			out[key] = l
			parents[o.Parent()] = true
		}
	}
	for key, o := range all {
		if _, ok := out[key]; ok || o.Parent() == "" || !parents[o.Parent()] {
			continue
		}
		c := *o
		p := T(&c)
		*p.Common().Pods = nil
		out[key] = p
	}
	return out
}

// podsOnNode returns o with only the pods whose hostIP is in addrs, or nil
// when none is. An object whose pods are all on this node is returned as is.
// The pods of a stand-in whose hostIP cannot be read are kept: they may be
// this node's, and isolating a pod of another node has no effect here.
func podsOnNode[R any, T row[R]](o T, addrs map[netip.Addr]bool) T {
	all := o.PodEntries()
	var pods []endpoints.PodEndpoint
	for _, p := range all {
		if p.HostIP.IsValid() && addrs[p.HostIP] || !p.HostIP.IsValid() && *o.Common().StandIn {
			pods = append(pods, p)
		}
	}
	switch len(pods) {
	case 0:
		return nil
	case len(all):
		return o
	}
	c := *o
	p := T(&c)
	*p.Common().Pods = pods
	return p
}
