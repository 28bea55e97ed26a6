package test

// The machinery of the AWS network policy controller suites: a policy node
// (enforce_helpers_test.go) holding the scenario's pods of this node and,
// in its peer netns, the pods of the other node and the addresses outside
// the cluster; a real API server made equal to a world of the reference;
// the controller v1.1.10 writing; enimasq-agent in the node reading the
// API server; the wait for the controller's writes (a watch of its
// objects, and its work queue idle in its metrics); the agent's verdicts,
// polled from its verdict API until they equal the reference and then
// taken from one `enimasq-dbg policy verdict --stdin` call; real packets;
// and the table of what disagrees.

import (
	"context"
	"encoding/json"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/test/k8stest"
)

// Node names of the scenario's pods (spec.nodeName).
const (
	awsThisNode  = "this-node"
	awsOtherNode = "other-node"
)

// awsEnv is one setup: the node, the API server, the controller at a chunk
// size, the agent, and the world the API server holds.
type awsEnv struct {
	t       *testing.T
	node    *policyNode
	cluster *k8stest.Cluster
	ctl     *k8stest.Controller
	metrics string // the controller's /metrics URL
	writes  *awsWrites
	agent   *Agent
	world   *awsWorld
	// names are every pod the scenario ever had, by name (a pod that is
	// gone keeps its name for its address).
	names map[string]awsName
	// answering are the addresses a probe may go to or come from: the
	// current pods of this node, the node, and every address of the peer
	// netns (a pod of the other node that is gone leaves an address
	// outside the cluster).
	answering map[string]bool
}

// newAWSEnv builds the node with the scenario's addresses, starts the API
// server, the controller at chunkSize and the agent, and makes the API
// server hold the scenario.
func newAWSEnv(t *testing.T, chunkSize int) *awsEnv {
	t.Helper()
	celltest.RequireRoot(t)
	e := &awsEnv{t: t, node: newPolicyNode(t), world: &awsWorld{NodeIP: awsNodeIP, Namespaces: map[string]map[string]string{}},
		names: map[string]awsName{"node": {ip: awsNodeIP}}, answering: map[string]bool{awsNodeIP: true, awsExtPeer: true}}
	scenario := awsScenario()

	// The node answers on its IP; the peer netns on the addresses outside
	// the cluster and those of the other node's pods (all of them from the
	// start: a pod's address answers before the pod is in the API).
	e.node.serve(e.node.Node, policyNodeIP)
	e.serveExtra(e.node.Node, policyNodeIP)
	e.serveExtra(e.node.peerNS(), awsExtPeer)
	run(t, "ip", "-n", e.node.Node, "route", "add", awsOutsideNet, "via", awsExtPeer)
	for _, ip := range awsExternal {
		e.addPeerAddress(ip)
	}
	cluster := k8stest.Start(t)
	e.cluster = cluster
	cluster.ForwardInto(t, e.node.ns[e.node.Node])

	addr, err := k8stest.FreeAddress()
	if err != nil {
		t.Fatal(err)
	}
	e.metrics = "http://" + addr + "/metrics"
	e.ctl = k8stest.StartController(t, cluster, chunkSize, "--metrics-bind-addr="+addr)
	e.writes = watchAWSWrites(t, cluster)

	// The agent's ENI IPAM reads the CiliumNode of its node: one without
	// ENIs (no ENI here), so that it knows there are none (and the node's
	// addresses are those of its interfaces).
	cluster.MustApply(t, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cilium.io/v2", "kind": "CiliumNode", "metadata": map[string]any{"name": awsThisNode}, "spec": map[string]any{}}})

	e.agent = NewAgent(t)
	e.agent.NetNSName = e.node.Node
	e.agent.Args = append(e.agent.Args, "--k8s-kubeconfig-path", cluster.Kubeconfig, "--k8s-node-name", awsThisNode,
		"--enable-network-policy", "--enable-ipv6=false",
		// The suite judges against the AWS agent, which skips domainName
		// entries: so do these (they allow nothing, no lookup is learnt).
		// With domain names on, the lookups of the pods they select go to
		// the DNS proxy, which passes only DNS: the suite's port-53 probes
		// ("x" datagrams) would be dropped. TestPrivilegedPolicyFQDNFromAWSController
		// is the controller's domain names, enforced.
		"--enable-policy-fqdn=false")
	e.agent.Start()
	e.agent.WaitHealthy()

	e.sync(scenario)
	return e
}

// serveExtra answers TCP ("ok") and UDP (echo) on awsExtraPorts of ip in
// the named netns.
func (e *awsEnv) serveExtra(nsName, ip string) {
	e.t.Helper()
	err := celltest.InNS(e.node.ns[nsName], func() error {
		for _, port := range awsExtraPorts() {
			addr := net.JoinHostPort(ip, strconv.Itoa(port))
			if err := answerOK(e.t, "tcp4", addr); err != nil {
				return err
			}
			if err := listenUDP(e.t, "udp4", addr, echo); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("serve %s in %s: %s", ip, nsName, err)
	}
}

// addPeerAddress makes the peer netns answer on ip (routed to it from the
// node: 10.0.1.0/24 is the node's link to it, awsOutsideNet a route).
func (e *awsEnv) addPeerAddress(ip string) {
	e.t.Helper()
	if e.answering[ip] {
		return
	}
	run(e.t, "ip", "-n", e.node.peerNS(), "addr", "add", ip+"/32", "dev", "eth0")
	e.node.serve(e.node.peerNS(), ip)
	e.serveExtra(e.node.peerNS(), ip)
	e.answering[ip] = true
}

// awsDevice is the host-side device of a pod of this node.
func awsDevice(p *awsPod) string { return "awc" + strings.ReplaceAll(p.Name, "-", "") }

// sync makes the API server (and the node) hold want: namespaces and their
// labels, pods (a pod of this node gets its netns and device first, as a
// CNI would before the kubelet reports it; a pod of this node that goes
// loses its device), and the policies of the three kinds, created,
// changed or deleted.
func (e *awsEnv) sync(want *awsWorld) {
	t := e.t
	t.Helper()
	have := e.world
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var apply, remove []*unstructured.Unstructured
	for _, ns := range awsSortedKeys(want.Namespaces) {
		if old, ok := have.Namespaces[ns]; !ok || !awsSameJSON(old, want.Namespaces[ns]) {
			labels := map[string]any{}
			for k, v := range want.Namespaces[ns] {
				labels[k] = v
			}
			apply = append(apply, &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns, "labels": labels}}})
		}
	}
	e.cluster.MustApply(t, apply...)
	apply = nil

	for i := range want.Pods {
		p := &want.Pods[i]
		e.names[p.Name] = awsName{key: p.key(), ip: p.IP}
		if old := have.pod(p.key()); old != nil {
			if !awsSameJSON(old, p) {
				t.Fatalf("pod %s changed: the suite only adds and deletes pods", p.key())
			}
			continue
		}
		node, hostIP := awsOtherNode, awsRemoteHostIP
		if p.Local {
			node, hostIP = awsThisNode, awsNodeIP
			e.node.addPod(p.Name, awsDevice(p), p.IP)
			e.serveExtra(e.node.podNS(p.Name), p.IP)
			e.answering[p.IP] = true
		} else {
			e.addPeerAddress(p.IP)
		}
		e.cluster.RunningPod(t, p.Namespace, p.Name, node, p.IP, hostIP, p.Labels, p.Ports...)
	}

	// Policies: JSON of each object of want, and of have, by kind/ns/name.
	wantObjs, haveObjs := awsPolicyObjects(t, want), awsPolicyObjects(t, have)
	for _, id := range awsSortedKeys(wantObjs) {
		if old, ok := haveObjs[id]; !ok || !awsSameJSON(old.Object, wantObjs[id].Object) {
			apply = append(apply, wantObjs[id])
		}
	}
	for _, id := range awsSortedKeys(haveObjs) {
		if _, ok := wantObjs[id]; !ok {
			remove = append(remove, haveObjs[id])
		}
	}
	e.cluster.MustApply(t, apply...)
	for _, obj := range remove {
		e.deletePolicy(ctx, obj)
	}

	for i := range have.Pods {
		p := &have.Pods[i]
		if want.pod(p.key()) != nil {
			continue
		}
		e.cluster.DeletePod(t, p.Namespace, p.Name)
		if p.Local { // the CNI's DEL: the device and its route go
			run(t, "ip", "-n", e.node.Node, "link", "del", awsDevice(p))
			delete(e.answering, p.IP)
		}
	}
	e.world = want.clone()
}

// deletePolicy deletes a policy, and then, as the garbage collector of
// kube-controller-manager would (none runs here), the PolicyEndpoints and
// ClusterPolicyEndpoints it owns (ownerReferences). For a NetworkPolicy or
// an ApplicationNetworkPolicy that is the only way they go: the controller
// v1.1.10's cleanup (policyEndpointsManager.Cleanup, CleanupANP) lists them
// with MatchingLabels on "spec.policyRef.name", a field index's name that
// no object carries as a label, and deletes none. (CleanupCNP lists by
// field and deletes them itself.)
func (e *awsEnv) deletePolicy(ctx context.Context, obj *unstructured.Unstructured) {
	t := e.t
	t.Helper()
	cur, err := e.cluster.Get(ctx, obj)
	if err != nil {
		t.Fatalf("delete %s %s: %v", obj.GetKind(), obj.GetName(), err)
	}
	if err := e.cluster.Delete(ctx, obj); err != nil {
		t.Fatal(err)
	}
	for _, store := range []cache.Store{e.writes.pes, e.writes.cpes} {
		for _, o := range store.List() {
			u := o.(*unstructured.Unstructured)
			if !slices.ContainsFunc(u.GetOwnerReferences(), func(r metav1.OwnerReference) bool { return r.UID == cur.GetUID() }) {
				continue
			}
			if err := e.cluster.Delete(ctx, u); err != nil {
				t.Fatalf("the garbage collector's part: %v", err)
			}
		}
	}
}

// awsPolicyObjects are the policies of w as API objects, by
// kind/namespace/name.
func awsPolicyObjects(t *testing.T, w *awsWorld) map[string]*unstructured.Unstructured {
	t.Helper()
	out := map[string]*unstructured.Unstructured{}
	add := func(obj any) {
		data, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal(data, &u.Object); err != nil {
			t.Fatal(err)
		}
		unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
		out[u.GetKind()+"/"+u.GetNamespace()+"/"+u.GetName()] = u
	}
	for i := range w.NetworkPolicies {
		add(&w.NetworkPolicies[i])
	}
	for i := range w.ANPs {
		add(&w.ANPs[i])
	}
	for i := range w.CNPs {
		add(&w.CNPs[i])
	}
	return out
}

func awsSameJSON(a, b any) bool {
	da, err1 := json.Marshal(a)
	db, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(da) == string(db)
}

func awsSortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
