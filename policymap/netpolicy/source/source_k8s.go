package source

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/cells/nodeips"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// policyK8sSource keeps policy-endpoints equal to the PolicyEndpoints of all
// namespaces in the API server, restricted to the pods on this node.
//
// Node rule: a pod entry (spec.podSelectorEndpoints[]) is this node's when
// its hostIP is one of this node's addresses: an address of an interface of
// the agent's network namespace (loopback excluded), or the primary IP of
// one of the node's ENIs (the enis table, when the ENI IPAM runs). Entries
// without a hostIP, or of other nodes, are dropped; an object left without
// pods is ignored (not in the table), unless another slice of its policy
// has pods here: its rules are theirs too (onThisNode). The addresses are re-read on every
// change and every --policy-endpoints-resync-interval.
//
// Each object goes through the same parser and validator as a file
// (ParsePolicyEndpoints, on its JSON), and fails closed as a file does
// (recover.go): an invalid object keeps its last good version, and without
// one is replaced by its stand-in, which isolates the pods it names in the
// directions it names (a pod whose hostIP cannot be read is kept: it may be
// this node's); health is Degraded, naming the object, field and value. An
// API error leaves the table as it is (Degraded, retried by the informer's
// backoff). The table is initialized once the informer has synced, whatever
// the objects hold.
type policyK8sSource struct {
	*policySource
	client  *k8sclient.Client
	nodeIPs statedb.Table[*nodeips.NodeIP]

	mu       sync.Mutex
	objects  filesource.Parts[*policyObject] // last good version, by namespace/name
	last     k8sclient.Snapshot
	haveLast bool
}

// policyObject is the last good version of one object, unfiltered.
type policyObject struct {
	resourceVersion string
	pe              *PolicyEndpoint
}

func newPolicyK8sSource(s *policySource, client *k8sclient.Client, nodeIPs statedb.Table[*nodeips.NodeIP]) *policyK8sSource {
	s.Failure = filesource.Always(apiFailure("invalid PolicyEndpoints, keeping their last good versions"))
	s.ValidAgain = filesource.Line{Msg: "PolicyEndpoints are valid and the API server answers again"}
	return &policyK8sSource{policySource: s, client: client, nodeIPs: nodeIPs}
}

func (s *policyK8sSource) run(ctx context.Context, health cell.Health) error {
	s.Log.Info("Watching PolicyEndpoints in the API server", "node", s.client.NodeName(), "api-server", s.client.Host())
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		defer close(done)
		// The node's addresses change without a PolicyEndpoint event:
		// re-evaluate on every change of node-ips and every resync.
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
	s.client.Watch(ctx, k8sclient.PolicyEndpoints, "", nil, func(snap k8sclient.Snapshot) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.last, s.haveLast = snap, true
		s.updateLocked(health, snap)
	})
	return nil
}

// addresses is the set of this node's addresses (see the node rule), once
// node-ips is initialized: before that, no pod can be said not to be this
// node's.
func (s *policyK8sSource) addresses() (map[netip.Addr]bool, error) {
	return nodeAddresses(s.DB, s.nodeIPs)
}

// nodeAddresses is the set of this node's addresses in nodeIPs, once it is
// initialized.
func nodeAddresses(db *statedb.DB, nodeIPs statedb.Table[*nodeips.NodeIP]) (map[netip.Addr]bool, error) {
	txn := db.ReadTxn()
	if ok, _ := nodeIPs.Initialized(txn); !ok {
		return nil, fmt.Errorf("waiting for the %s table (pending: %v)", nodeips.TableName, nodeIPs.PendingInitializers(txn))
	}
	return nodeips.Set(txn, nodeIPs), nil
}

func (s *policyK8sSource) updateLocked(health cell.Health, snap k8sclient.Snapshot) {
	if snap.Err != nil {
		s.Fail(health, snap.Err, apiFailure("API server error, keeping the PolicyEndpoints as they are, retrying"))
		return
	}
	addrs, err := s.addresses()
	if err != nil {
		s.Fail(health, err, apiFailure("cannot tell the pods of this node, keeping the PolicyEndpoints as they are"))
		return
	}
	byKey := make(map[string]*unstructured.Unstructured, len(snap.Objects))
	keys := make([]string, 0, len(snap.Objects))
	for _, obj := range snap.Objects {
		key := obj.GetNamespace() + "/" + obj.GetName()
		byKey[key] = obj
		keys = append(keys, key)
	}
	var invalidMu sync.Mutex
	invalid := map[string]*policyObject{} // what an object in error puts in force
	current, _, errs := s.objects.Read(keys, func(key string, last *policyObject) (*policyObject, error) {
		obj := byKey[key]
		if last != nil && last.resourceVersion == obj.GetResourceVersion() {
			return last, nil
		}
		pe, err := parseAPIObject(key, obj.Object)
		if err != nil {
			var lastGood []*PolicyEndpoint
			if last != nil {
				lastGood = []*PolicyEndpoint{last.pe}
			}
			stand := recoverAPIObject(key, obj.Object, err)
			invalidMu.Lock()
			invalid[key] = &policyObject{pe: resolve([]parsedObject{{pe: stand, err: err}}, lastGood)[0]}
			invalidMu.Unlock()
			return nil, err
		}
		return &policyObject{resourceVersion: obj.GetResourceVersion(), pe: pe}, nil
	})
	current = maps.Clone(current) // Parts' own map holds the good versions only
	maps.Copy(current, invalid)

	all := make(map[string]*PolicyEndpoint, len(current))
	for key, obj := range current {
		all[key] = obj.pe
	}
	desired := onThisNode(all, func(pe *PolicyEndpoint) *PolicyEndpoint { return podsOnNode(pe, addrs) },
		func(pe *PolicyEndpoint, pods []PodEndpoint) { pe.Pods = pods })
	in := s.input(desired, nil)
	in.Summary = fmt.Sprintf("%d PolicyEndpoints for the pods of this node, of %d in the API server", len(in.Rows), len(current))
	s.Update(health, in, joinErrors(errs))
}

// apiFailure reports a failure of the API source: reason says what stays.
func apiFailure(reason string) filesource.Failure {
	return filesource.Failure{Log: "PolicyEndpoints: " + reason, Health: "PolicyEndpoints: " + reason, Announce: true}
}

// parseAPIObject runs one object from the API server through the file
// parser. Its File is "policyendpoints/<namespace>/<name>".
func parseAPIObject(key string, obj map[string]any) (*PolicyEndpoint, error) {
	return parseAPI("policyendpoints/"+key, obj, parseObject)
}

// parseAPI runs an object of the API server, as file, through parse (at
// the root of the document: no field path).
func parseAPI[T any](file string, obj map[string]any, parse func(file string, base *field.Path, data []byte) (T, error)) (T, error) {
	var zero, out T
	data, err := json.Marshal(obj)
	if err == nil {
		out, err = parse(file, nil, data)
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

// recoverAPIObject is the stand-in of an object of the API server that is
// not valid.
func recoverAPIObject(key string, obj map[string]any, cause error) *PolicyEndpoint {
	return recoverJSON("policyendpoints/"+key, key, key, apiJSON(obj), cause)
}

// onThisNode returns the objects of all (by key) that this node enforces:
// each with only its pods on this node (local: nil when none), and of
// those with none, the slices of a policy that another slice gives pods
// here, without pods (setPods on a copy): a policy is the union of its
// slices (endpoints.Union), so their rules are those pods' too.
func onThisNode[T any, P interface {
	*T
	endpoints.Slice
}](all map[string]P, local func(P) P, setPods func(P, []PodEndpoint)) map[string]P {
	out := make(map[string]P, len(all))
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
		c := P(new(T))
		*c = *o
		setPods(c, nil)
		out[key] = c
	}
	return out
}

// podsOnNode returns pe with only the pods whose hostIP is in addrs, or nil
// when none is. An object whose pods are all on this node is returned as is.
// The pods of a stand-in whose hostIP cannot be read are kept: they may be
// this node's, and isolating a pod of another node has no effect here.
func podsOnNode(pe *PolicyEndpoint, addrs map[netip.Addr]bool) *PolicyEndpoint {
	return onNode(pe, pe.Pods, pe.StandIn, addrs, func(c *PolicyEndpoint, pods []PodEndpoint) { c.Pods = pods })
}

// onNode is podsOnNode for an object of either kind: obj's pods, setPods
// setting them on a copy.
func onNode[T any](obj *T, all []PodEndpoint, standIn bool, addrs map[netip.Addr]bool, setPods func(*T, []PodEndpoint)) *T {
	var pods []PodEndpoint
	for _, p := range all {
		if p.HostIP.IsValid() && addrs[p.HostIP] || !p.HostIP.IsValid() && standIn {
			pods = append(pods, p)
		}
	}
	switch len(pods) {
	case 0:
		return nil
	case len(all):
		return obj
	}
	c := *obj
	setPods(&c, pods)
	return &c
}
