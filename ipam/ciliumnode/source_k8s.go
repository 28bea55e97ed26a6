package ciliumnode

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/enimasq/enimasq/cells/filesource"
	"github.com/enimasq/enimasq/cells/k8sclient"
)

// k8sSource keeps the enis table in step with the CiliumNode named after
// this node in the API server. It feeds the object, as JSON, to the same
// parser as the file source (ParseCiliumNode) and the same rows, so the
// same object gives the same rows from a file or from the API.
//
// The table is initialized once the informer has synced and the object has
// been applied. An API error, or the object deleted, keeps the last ENIs
// (nothing is removed) and makes health Degraded; the informer retries with
// its backoff and everything converges when the API server is back.
type k8sSource struct {
	*source // path is "ciliumnodes/<node>", the prefix of parse errors
	client  *k8sclient.Client

	mu   sync.Mutex
	last *k8sclient.Snapshot // applied again when a hold ends
	held chan struct{}       // a hold began
}

func newK8sSource(p sourceParams, initDone func(statedb.WriteTxn)) *k8sSource {
	node := p.Client.NodeName()
	s := newSource("ciliumnodes/"+node, p, initDone)
	s.ValidAgain = filesource.Line{Msg: "CiliumNode is valid and reachable again", Attrs: []any{"node", node}}
	return &k8sSource{source: s, client: p.Client, held: make(chan struct{}, 1)}
}

// checkSource rejects an explicit --ciliumnode-path together with
// an enabled API client: the CiliumNode comes from one source only.
func checkSource(s Settings, client *k8sclient.Client) error {
	if client == nil || !client.IsEnabled() || s.Path == DefaultPath {
		return nil
	}
	return fmt.Errorf("--ciliumnode-path %s is set and the Kubernetes API server is enabled (%s): "+
		"the CiliumNode comes from one source; drop --ciliumnode-path to read ciliumnodes/%s from the API server, "+
		"or run without --k8s-kubeconfig-path outside a pod to read the file",
		s.Path, client.Source(), client.NodeName())
}

func (s *k8sSource) run(ctx context.Context, health cell.Health) error {
	node := s.client.NodeName()
	s.Log.Info("Watching the CiliumNode in the API server", "node", node, "api-server", s.client.Host())
	go s.holdEnds(ctx, health)
	s.client.Watch(ctx, k8sclient.CiliumNodes, "", func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", node).String()
	}, func(snap k8sclient.Snapshot) { s.update(health, snap) })
	return nil
}

// holdEnds applies the last CiliumNode again when a hold ends: the API
// server sends no event then.
func (s *k8sSource) holdEnds(ctx context.Context, health cell.Health) {
	for {
		var end <-chan time.Time
		if d := s.hold.next(); d > 0 {
			end = time.After(d)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.held:
		case <-end:
			s.mu.Lock()
			last := s.last
			s.mu.Unlock()
			if last != nil {
				s.update(health, *last)
			}
		}
	}
}

func (s *k8sSource) update(health cell.Health, snap k8sclient.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = &snap
	defer func() {
		if s.hold.next() > 0 {
			select {
			case s.held <- struct{}{}:
			default:
			}
		}
	}()
	node := s.client.NodeName()
	if snap.Err != nil {
		kept := "keeping the last ENIs"
		if !s.Initialized() {
			kept = "no ENIs yet"
		}
		s.Fail(health, snap.Err, filesource.Failure{
			Log:      "CiliumNode: API server error, retrying",
			Attrs:    []any{"node", node, "state", kept, "error", snap.Err},
			Health:   fmt.Sprintf("CiliumNode %s: API server error, %s, retrying", node, kept),
			Announce: s.Initialized(),
		})
		return
	}
	var obj map[string]any
	for _, o := range snap.Objects {
		if o.GetName() == node && o.GetNamespace() == "" {
			obj = o.Object
		}
	}
	switch {
	case obj == nil && !s.Initialized():
		s.Fail(health, nil, filesource.Failure{
			Waiting: true, Uncounted: true,
			Log:    "CiliumNode does not exist yet in the API server: no ENIs, no allocations until it does",
			Attrs:  []any{"node", node},
			Health: fmt.Sprintf("waiting for CiliumNode %s in the API server", node),
		})
	case obj == nil:
		s.Fail(health, fmt.Errorf("ciliumnodes/%s: not found in the API server", node), filesource.Failure{
			Uncounted: true, Announce: true,
			Log:    "CiliumNode was deleted from the API server: keeping the last ENIs",
			Attrs:  []any{"node", node},
			Health: "CiliumNode deleted, keeping the last ENIs",
		})
	default:
		in, err := s.parse(obj)
		s.Update(health, s.hold.apply(in), err)
	}
}

// parse runs the object through the file's parser.
func (s *k8sSource) parse(obj map[string]any) (*filesource.Input[*ENI], error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.path, err)
	}
	return input(ParseCiliumNode(s.path, data))
}
