package ipam

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/cilium/hive/cell"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/enimasq/enimasq/cells/k8sclient"
)

// k8sSource keeps the enis table in step with the CiliumNode named after
// this node in the API server. It feeds the object, as JSON, to the same
// parser as the file source (ParseCiliumNode) and the same DiffENIs, so the
// same object gives the same rows from a file or from the API.
//
// The table is initialized once the informer has synced and the object has
// been applied. An API error, or the object deleted, keeps the last ENIs
// (nothing is removed) and makes health Degraded; the informer retries with
// its backoff and everything converges when the API server is back.
type k8sSource struct {
	*source // path is "ciliumnodes/<node>", the prefix of parse errors
	client  *k8sclient.Client
}

func newK8sSource(s *source, client *k8sclient.Client) *k8sSource {
	s.path = "ciliumnodes/" + client.NodeName()
	return &k8sSource{source: s, client: client}
}

// checkCiliumNodeSource rejects an explicit --ciliumnode-path together with
// an enabled API client: the CiliumNode comes from one source only.
func checkCiliumNodeSource(cfg Config, client *k8sclient.Client) error {
	if client == nil || !client.IsEnabled() || cfg.CiliumNodePath == DefaultConfig.CiliumNodePath {
		return nil
	}
	return fmt.Errorf("--ciliumnode-path %s is set and the Kubernetes API server is enabled (%s): "+
		"the CiliumNode comes from one source; drop --ciliumnode-path to read ciliumnodes/%s from the API server, "+
		"or run without --k8s-kubeconfig-path outside a pod to read the file",
		cfg.CiliumNodePath, client.Source(), client.NodeName())
}

func (s *k8sSource) run(ctx context.Context, health cell.Health) error {
	node := s.client.NodeName()
	s.log.Info("Watching the CiliumNode in the API server", "node", node, "api-server", s.client.Host())
	s.client.Watch(ctx, k8sclient.CiliumNodes, "", func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", node).String()
	}, func(snap k8sclient.Snapshot) { s.update(health, snap) })
	return nil
}

func (s *k8sSource) update(health cell.Health, snap k8sclient.Snapshot) {
	node := s.client.NodeName()
	if snap.Err != nil {
		kept := "keeping the last ENIs"
		if s.initDone != nil {
			kept = "no ENIs yet"
		}
		s.logOnce(fmt.Sprintf("API server: %s", snap.Err), func() {
			s.log.Error("CiliumNode: API server error, retrying", "node", node, "state", kept, "error", snap.Err)
		})
		s.metrics.Error()
		health.Degraded(fmt.Sprintf("CiliumNode %s: API server error, %s, retrying", node, kept), snap.Err)
		return
	}
	var obj map[string]any
	for _, o := range snap.Objects {
		if o.GetName() == node && o.GetNamespace() == "" {
			obj = o.Object
		}
	}
	if obj == nil {
		if s.initDone != nil {
			s.logOnce("absent", func() {
				s.log.Info("CiliumNode does not exist yet in the API server: no ENIs, no allocations until it does", "node", node)
			})
			health.OK(fmt.Sprintf("waiting for CiliumNode %s in the API server", node))
			return
		}
		err := fmt.Errorf("ciliumnodes/%s: not found in the API server", node)
		s.logOnce("deleted", func() {
			s.log.Error("CiliumNode was deleted from the API server: keeping the last ENIs", "node", node)
		})
		health.Degraded("CiliumNode deleted, keeping the last ENIs", err)
		return
	}
	data, err := json.Marshal(obj)
	if err != nil {
		s.fail(health, fmt.Errorf("%s: %w", s.path, err))
		return
	}
	n, err := ParseCiliumNode(s.path, data)
	if err != nil {
		s.fail(health, err)
		return
	}
	if s.lastErr != "" && s.initDone == nil {
		s.log.Info("CiliumNode is valid and reachable again", "node", node)
	}
	s.lastErr = ""
	s.apply(health, n)
}

// logOnce runs log when key differs from the last error logged.
func (s *k8sSource) logOnce(key string, log func()) {
	if key != s.lastErr {
		s.lastErr = key
		log()
	}
}
