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
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/enimasq/enimasq/cells/agentapi"
	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/policymap/netpolicy/source"
	"github.com/enimasq/enimasq/test/k8stest"
)

// Node names of the scenario's pods (spec.nodeName).
const (
	awsThisNode  = "this-node"
	awsOtherNode = "other-node"
)

// awsVerdictSettle is the requirement: after the controller's last write,
// enimasq's verdicts equal the reference within this long.
const awsVerdictSettle = time.Second

// awsVerdictGrace is how much longer the verdicts are polled after the
// requirement's second has passed, to tell a late agent from a wrong one.
const awsVerdictGrace = 4 * time.Second

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
		"--enable-network-policy", "--enable-ipv6=false")
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

// awsWrites follows the controller's objects (PolicyEndpoints and
// ClusterPolicyEndpoints) on the API server: how many writes were seen and
// when the last one was.
type awsWrites struct {
	mu    sync.Mutex
	count int
	last  time.Time
	pes   cache.Store
	cpes  cache.Store
}

func watchAWSWrites(t *testing.T, c *k8stest.Cluster) *awsWrites {
	t.Helper()
	w := &awsWrites{}
	f := dynamicinformer.NewDynamicSharedInformerFactory(c.Dynamic(), 0)
	note := func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.count++
		w.last = time.Now()
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { note() },
		UpdateFunc: func(any, any) { note() },
		DeleteFunc: func(any) { note() },
	}
	for _, gvr := range []schema.GroupVersionResource{k8sclient.PolicyEndpoints, source.ClusterPolicyEndpoints} {
		inf := f.ForResource(gvr).Informer()
		if _, err := inf.AddEventHandler(handler); err != nil {
			t.Fatal(err)
		}
		if gvr == k8sclient.PolicyEndpoints {
			w.pes = inf.GetStore()
		} else {
			w.cpes = inf.GetStore()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); f.Shutdown() })
	f.Start(ctx.Done())
	for gvr, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("watching %s: no sync", gvr.Resource)
		}
	}
	return w
}

func (w *awsWrites) snapshot() (int, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.count, w.last
}

// controllerIdle says whether the controller has nothing queued and no
// reconcile running (controller-runtime's workqueue_depth and
// controller_runtime_active_workers, all zero).
func (e *awsEnv) controllerIdle() (bool, error) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(e.metrics)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, err
	}
	seen := 0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "workqueue_depth{") && !strings.HasPrefix(line, "controller_runtime_active_workers{") {
			continue
		}
		seen++
		fields := strings.Fields(line)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err != nil || v != 0 {
			return false, err
		}
	}
	if seen == 0 {
		return false, fmt.Errorf("no workqueue_depth or controller_runtime_active_workers in %s", e.metrics)
	}
	return true, nil
}

// awsGot is enimasq's verdict for one query (enimasq-dbg -o json).
type awsGot struct {
	Query   string `json:"query"`
	Verdict string `json:"verdict"`
	Step    string `json:"step"`
	Object  string `json:"object"`
	Reason  string `json:"reason"`
	Error   string `json:"error"`
}

func (g awsGot) String() string {
	if g.Error != "" {
		return "ERROR " + g.Error
	}
	s := g.Verdict + " " + g.Step
	if g.Object != "" {
		s += " " + g.Object
	}
	return s
}

// verdicts asks `enimasq-dbg policy verdict --stdin -o json` for every
// query in one call: the verdict, the deciding step and object.
func (e *awsEnv) verdicts(qs []awsQuery) ([]awsGot, error) {
	var in strings.Builder
	for _, q := range qs {
		fmt.Fprintf(&in, "%s %s %s %s %d\n", q.Dir, e.world.pod(q.Pod).IP, q.Peer, q.Proto, q.Port)
	}
	cmd := exec.Command(Build(e.t).Dbg, "--state-dir", e.agent.StateDir, "policy", "verdict", "--stdin", "-o", "json")
	cmd.Stdin = strings.NewReader(in.String())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var got []awsGot
	if err := json.Unmarshal(out, &got); err != nil {
		return nil, fmt.Errorf("enimasq-dbg policy verdict --stdin: %v (%v)\n%s%s", runErr, err, out, stderr.String())
	}
	if len(got) != len(qs) {
		return nil, fmt.Errorf("enimasq-dbg policy verdict --stdin: %d answers to %d queries", len(got), len(qs))
	}
	return got, nil
}

// awsRow is one case as judged: the reference, enimasq, and the packet.
type awsRow struct {
	k   awsCase
	q   awsQuery
	ref awsAnswer
	got awsGot
	// sent: a packet was tried; passed: it got its answer; want: the
	// reference for the packet's whole way (the other end's verdict too,
	// when it is a pod of this node).
	sent, passed, want bool
	why                string // the other end's verdict, when it decides the packet
}

// verdictOK: enimasq allows or denies as the reference does, at the same
// step (admin, namespace, baseline, default).
func (r *awsRow) verdictOK() bool {
	return r.got.Error == "" && (r.got.Verdict == "ALLOW") == r.ref.Allow && r.got.Step == r.ref.Step
}

// packetOK: no packet was sent, or it passed as the reference says.
func (r *awsRow) packetOK() bool { return !r.sent || r.passed == r.want }

// rows are the cases that apply to the current world (their pod is a pod
// of this node), with the reference's answers.
func (e *awsEnv) rows(cases []awsCase) []*awsRow {
	t := e.t
	t.Helper()
	var out []*awsRow
	seen := map[awsQuery]bool{}
	for _, k := range cases {
		q, err := k.query(e.names)
		if err != nil {
			t.Fatal(err)
		}
		if p := e.world.pod(q.Pod); p == nil || !p.Local || seen[q] {
			continue
		}
		seen[q] = true
		ref, err := e.world.Verdict(q)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &awsRow{k: k, q: q, ref: ref})
	}
	return out
}

// judge waits until the controller has written (more than since writes
// seen) and settled (idle twice in a row, 100 ms apart, with no write
// between), and checks that the verdicts of the program on the pods'
// devices equal the reference's within awsVerdictSettle of its last write:
// the verdicts are polled all along, and the time that counts is the start
// of the first poll of the run of agreeing polls that ends the wait. Then
// it sends the packets of the cases that packets picks (TCP and UDP, both
// ends answering), then asks `enimasq-dbg policy verdict` for every case,
// whose answers (verdict, step and object) are what the table reports.
// Every disagreement is reported in one table.
//
// The polls ask the agent's verdict API (POST /v1/policy/verdict, the
// program enimasq-dbg asks too) rather than enimasq-dbg itself: a call of
// enimasq-dbg reads the pinned maps for each query (the deciding entries),
// about a second for this many queries on a loaded two-core machine, which
// would blur a one-second requirement; a call of the API takes
// milliseconds.
func (e *awsEnv) judge(what string, cases []awsCase, since int, packets func(*awsRow) bool) []*awsRow {
	t := e.t
	t.Helper()
	rows := e.rows(cases)
	qs := make([]awsQuery, len(rows))
	for i, r := range rows {
		qs[i] = r.q
	}
	type poll struct {
		at, took time.Duration // since the start
		wrong    int           // -1: the call failed
	}
	start := time.Now()
	var polls []poll
	var written, runStart time.Time // the controller's last write; the first poll of the agreeing run
	var lastErr error
	settled, idleAt := false, -1
	controllerDeadline := start.Add(90 * time.Second)
	for {
		t0 := time.Now()
		got, err := e.agentVerdicts(qs)
		now := time.Now()
		lastErr = err
		wrong := -1
		if err == nil {
			wrong = 0
			for i, r := range rows {
				r.got = got[i]
				if !r.verdictOK() {
					wrong++
				}
			}
		}
		polls = append(polls, poll{t0.Sub(start), now.Sub(t0), wrong})
		switch {
		case wrong != 0:
			runStart = time.Time{}
		case runStart.IsZero():
			runStart = t0
		}
		if !settled {
			count, last := e.writes.snapshot()
			idle, ierr := e.controllerIdle()
			switch {
			case ierr != nil && now.After(controllerDeadline):
				t.Fatalf("%s: the controller's metrics: %v\n%s", what, ierr, e.ctl.LogTail())
			case count > since && idle && idleAt == count:
				settled, written = true, last
			case count > since && idle:
				idleAt = count
			default:
				idleAt = -1
			}
			if !settled && now.After(controllerDeadline) {
				t.Fatalf("%s: the controller did not write and settle in 90 s (%d writes, %d before; idle %t)\n%s",
					what, count, since, idle, e.ctl.LogTail())
			}
		}
		if settled && (wrong == 0 || now.After(written.Add(awsVerdictSettle+awsVerdictGrace))) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The polls around the write, for the report of a late or wrong agent:
	// when (after the last write), how long the call took, how many
	// verdicts disagreed.
	var timeline []string
	for _, p := range polls {
		if at := start.Add(p.at).Sub(written); at > -2*time.Second && len(timeline) < 40 {
			timeline = append(timeline, fmt.Sprintf("%+v(%v):%d", at.Round(time.Millisecond), p.took.Round(time.Millisecond), p.wrong))
		}
	}
	timelineText := strings.Join(timeline, " ")
	latency := runStart.Sub(written)
	switch {
	case lastErr != nil:
		t.Errorf("%s: %v", what, lastErr)
	case runStart.IsZero():
		t.Logf("%s: the verdicts never equalled the reference; polls (after the controller's last write, the call's time, disagreeing): %s", what, timelineText)
	case latency > awsVerdictSettle:
		t.Errorf("%s: the verdicts equal the reference %v after the controller's last write, want within %v; polls (the call's time, disagreeing): %s",
			what, latency.Round(time.Millisecond), awsVerdictSettle, timelineText)
	case latency <= 0:
		t.Logf("%s: %d verdicts equal the reference from before the controller's last write (%v)", what, len(rows), latency.Round(time.Millisecond))
	default:
		t.Logf("%s: %d verdicts equal the reference %v after the controller's last write", what, len(rows), latency.Round(time.Millisecond))
	}

	if packets != nil {
		e.packets(rows, packets)
	}
	// enimasq-dbg's answers, after the packets: the verdicts still hold
	// (no late write undid them), and they name the deciding objects.
	if got, err := e.verdicts(qs); err != nil {
		t.Errorf("%s: %v", what, err)
	} else {
		for i, r := range rows {
			r.got = got[i]
		}
	}
	e.report(what, rows)
	return rows
}

// agentVerdicts asks the agent's verdict API for every query: its program
// on a packet of each.
func (e *awsEnv) agentVerdicts(qs []awsQuery) ([]awsGot, error) {
	type query struct {
		Direction string `json:"direction"`
		Pod       string `json:"pod"`
		Peer      string `json:"peer"`
		Protocol  uint32 `json:"protocol"`
		Port      int32  `json:"port,omitempty"`
	}
	req := struct {
		Queries []query `json:"queries"`
	}{}
	for _, q := range qs {
		proto := map[string]uint32{"tcp": 6, "udp": 17, "sctp": 132}[q.Proto]
		req.Queries = append(req.Queries, query{Direction: q.Dir, Pod: e.world.pod(q.Pod).IP, Peer: q.Peer, Protocol: proto, Port: q.Port})
	}
	code, data, err := agentapi.NewClient(e.agent.APISocket(), 10*time.Second).Send(http.MethodPost, awsVerdictPath, req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", awsVerdictPath, err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("POST %s: %d %s\n%s", awsVerdictPath, code, http.StatusText(code), data)
	}
	var answer struct {
		Results []struct {
			Allow  bool   `json:"allow"`
			Step   string `json:"step"`
			Object string `json:"object"`
		} `json:"results"`
	}
	if err := json.Unmarshal(data, &answer); err != nil {
		return nil, fmt.Errorf("POST %s: %w\n%s", awsVerdictPath, err, data)
	}
	if len(answer.Results) != len(qs) {
		return nil, fmt.Errorf("POST %s: %d answers to %d queries", awsVerdictPath, len(answer.Results), len(qs))
	}
	out := make([]awsGot, len(qs))
	for i, r := range answer.Results {
		out[i] = awsGot{Verdict: "DENY", Step: r.Step, Object: r.Object}
		if r.Allow {
			out[i].Verdict = "ALLOW"
		}
	}
	return out, nil
}

// awsVerdictPath is the agent's verdict API (what enimasq-dbg policy
// verdict asks the running agent).
const awsVerdictPath = "/v1/policy/verdict"

// packets sends a packet for each row that sel picks, is TCP or UDP and
// whose ends answer: a TCP connection (the SYN, the SYN-ACK and the data)
// or a UDP datagram and its echo. Its expected outcome is the reference's
// verdict, and the other end's when it is a pod of this node (its own
// egress or ingress). A failed probe that should have passed is tried
// twice more (a slow machine may lose one; a pass cannot be a fluke).
func (e *awsEnv) packets(rows []*awsRow, sel func(*awsRow) bool) {
	t := e.t
	t.Helper()
	e.waitAttached()
	var todo []*awsRow
	for _, r := range rows {
		if (r.q.Proto != "tcp" && r.q.Proto != "udp") || !sel(r) || !e.answering[r.q.Peer] || !e.answering[e.world.pod(r.q.Pod).IP] {
			continue
		}
		r.sent, r.want = true, r.ref.Allow
		if other := e.world.podByIP(netip.MustParseAddr(r.q.Peer)); other != nil && other.Local && r.ref.Allow {
			back := awsQuery{Pod: other.key(), Dir: "ingress", Peer: e.world.pod(r.q.Pod).IP, Proto: r.q.Proto, Port: r.q.Port}
			if r.q.Dir == "ingress" {
				back.Dir = "egress"
			}
			ans, err := e.world.Verdict(back)
			if err != nil {
				t.Fatal(err)
			}
			if !ans.Allow {
				r.want = false
				r.why = fmt.Sprintf("%s %s: %s", other.Name, back.Dir, ans)
			}
		}
		todo = append(todo, r)
	}
	work := make(chan *awsRow)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range work {
				for try := 0; try < 3; try++ {
					if r.passed = e.probe(r.q); r.passed || !r.want {
						break
					}
				}
			}
		}()
	}
	for _, r := range todo {
		work <- r
	}
	close(work)
	wg.Wait()
}

// probe sends the query's packet for real: egress from the pod's netns,
// ingress from the peer's (a pod of this node: its netns; the node: the
// node netns; else the peer netns, from that address).
func (e *awsEnv) probe(q awsQuery) bool {
	pod := e.world.pod(q.Pod)
	if q.Dir == "egress" {
		return dialFrom(e.node.ns[e.node.podNS(pod.Name)], q.Proto, "", q.Peer, int(q.Port))
	}
	switch other := e.world.podByIP(netip.MustParseAddr(q.Peer)); {
	case other != nil && other.Local:
		return dialFrom(e.node.ns[e.node.podNS(other.Name)], q.Proto, "", pod.IP, int(q.Port))
	case q.Peer == awsNodeIP:
		return dialFrom(e.node.ns[e.node.Node], q.Proto, q.Peer, pod.IP, int(q.Port))
	default:
		return dialFrom(e.node.ns[e.node.peerNS()], q.Proto, q.Peer, pod.IP, int(q.Port))
	}
}

// report fails the test with a table of the rows whose verdict or packet
// disagrees with the reference.
func (e *awsEnv) report(what string, rows []*awsRow) {
	t := e.t
	t.Helper()
	var bad []*awsRow
	sent, verdictBad, packetBad := 0, 0, 0
	for _, r := range rows {
		if r.sent {
			sent++
		}
		if !r.verdictOK() {
			verdictBad++
		}
		if !r.packetOK() {
			packetBad++
		}
		if !r.verdictOK() || !r.packetOK() {
			bad = append(bad, r)
		}
	}
	t.Logf("%s: %d cases, %d with packets; %d verdicts and %d packets disagree with the reference", what, len(rows), sent, verdictBad, packetBad)
	if len(bad) == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d of %d verdicts and %d of %d packets disagree with the reference:\n", what, verdictBad, len(rows), packetBad, sent)
	fmt.Fprintf(&b, "%-44s %-17s %-52s %-22s %s\n", "case", "reference", "enimasq (step object)", "packet", "the reference's reason")
	for _, r := range bad {
		pkt := "-"
		if r.sent {
			pkt = fmt.Sprintf("passed=%t want %t", r.passed, r.want)
			if !r.packetOK() {
				pkt = "✗ " + pkt
			}
		}
		enq := r.got.String()
		if !r.verdictOK() {
			enq = "✗ " + enq
		}
		why := r.ref.Why
		if r.why != "" {
			why += "; packet: " + r.why
		}
		fmt.Fprintf(&b, "%-44s %-17s %-52s %-22s %s\n", r.caseText(), r.ref, enq, pkt, why)
	}
	t.Error(b.String())
}

// caseText is the case with its peer's name and address.
func (r *awsRow) caseText() string {
	peer := r.q.Peer
	if r.k.peer != r.q.Peer {
		peer = r.k.peer + "(" + r.q.Peer + ")"
	}
	return fmt.Sprintf("%s %s %s %s/%d", r.k.pod, r.q.Dir, peer, r.q.Proto, r.q.Port)
}

// checkObjects checks the agent's tables: no PolicyEndpoint or
// ClusterPolicyEndpoint refused (Error column empty), health naming
// nothing invalid, and every ClusterPolicyEndpoint's warning naming
// spec.subject, the field the controller writes and the decoder does not
// know, in its row and the agent's log. Each check fails once, naming
// every object it concerns.
func (e *awsEnv) checkObjects(what string) {
	t := e.t
	t.Helper()
	var refused []string
	for _, table := range []string{"policy-endpoints", "cluster-policy-endpoints"} {
		rows, err := e.showColumns(table, "Name", "Error")
		if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		for _, r := range rows {
			if r[1] != "" {
				refused = append(refused, fmt.Sprintf("%s %s: %s", table, r[0], r[1]))
			}
		}
	}
	if len(refused) > 0 {
		t.Errorf("%s: %d objects refused (their Error column):\n\t%s", what, len(refused), strings.Join(refused, "\n\t"))
	}
	if _, body, err := e.agent.Get("/healthz"); err != nil {
		t.Errorf("%s: /healthz: %v", what, err)
	} else if strings.Contains(strings.ToLower(string(body)), "invalid") {
		var rep struct {
			Modules []struct {
				Degraded []struct{ Scope, Message string }
			}
		}
		var msgs []string
		if err := json.Unmarshal(body, &rep); err != nil {
			msgs = append(msgs, string(body))
		}
		for _, m := range rep.Modules {
			for _, d := range m.Degraded {
				msg := d.Message
				if len(msg) > 300 {
					msg = msg[:300] + "..."
				}
				msgs = append(msgs, d.Scope+": "+msg)
			}
		}
		t.Errorf("%s: health names something invalid:\n\t%s", what, strings.Join(msgs, "\n\t"))
	}
	rows, err := e.showColumns("cluster-policy-endpoints", "Name", "Warnings")
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	if len(rows) == 0 {
		t.Errorf("%s: no ClusterPolicyEndpoint in the agent's table", what)
	}
	var unnamed []string
	for _, r := range rows {
		if !strings.Contains(r[1], "subject") {
			unnamed = append(unnamed, fmt.Sprintf("%s (%q)", r[0], r[1]))
		}
	}
	if len(unnamed) > 0 {
		t.Errorf("%s: %d of %d ClusterPolicyEndpoints' warnings do not name spec.subject (the field the decoder does not know): %s",
			what, len(unnamed), len(rows), strings.Join(unnamed, ", "))
	}
	if !strings.Contains(e.agent.Log(), "subject") {
		t.Errorf("%s: the agent's log does not name spec.subject", what)
	}
}

// showColumns is `db/show --columns=...` of a table, one row a slice: the
// first column is a name (no spaces), the last takes the rest of the line.
func (e *awsEnv) showColumns(table string, columns ...string) ([][]string, error) {
	out, errOut, err := e.agent.Dbg("shell", "--", "db/show", "--columns="+strings.Join(columns, ","), table)
	if err != nil {
		return nil, fmt.Errorf("db/show %s: %v\n%s%s", table, err, out, errOut)
	}
	var rows [][]string
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 || !strings.HasPrefix(strings.TrimSpace(lines[0]), columns[0]) {
		return nil, fmt.Errorf("db/show %s: no header in\n%s", table, out)
	}
	for _, line := range lines[1:] {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		row := []string{fields[0], strings.Join(fields[1:], " ")}
		rows = append(rows, row)
	}
	return rows, nil
}

// slices counts the controller's objects per parent policy: slices of
// each NetworkPolicy or ApplicationNetworkPolicy (namespace/name) and of
// each ClusterNetworkPolicy, and the slices that hold rules and no pod.
func (e *awsEnv) slices() (pe, cpe map[string]int, rulesNoPods int) {
	pe, cpe = map[string]int{}, map[string]int{}
	count := func(store cache.Store, into map[string]int, key func(*unstructured.Unstructured) string) {
		for _, o := range store.List() {
			u := o.(*unstructured.Unstructured)
			into[key(u)]++
			pods, _, _ := unstructured.NestedSlice(u.Object, "spec", "podSelectorEndpoints")
			in, _, _ := unstructured.NestedSlice(u.Object, "spec", "ingress")
			out, _, _ := unstructured.NestedSlice(u.Object, "spec", "egress")
			if len(pods) == 0 && len(in)+len(out) > 0 {
				rulesNoPods++
			}
		}
	}
	count(e.writes.pes, pe, func(u *unstructured.Unstructured) string {
		ns, _, _ := unstructured.NestedString(u.Object, "spec", "policyRef", "namespace")
		name, _, _ := unstructured.NestedString(u.Object, "spec", "policyRef", "name")
		return ns + "/" + name
	})
	count(e.writes.cpes, cpe, func(u *unstructured.Unstructured) string {
		name, _, _ := unstructured.NestedString(u.Object, "spec", "policyRef", "name")
		return name
	})
	return pe, cpe, rulesNoPods
}

// checkSliced logs how the controller cut the policies and, at a chunk
// size of 2, fails unless a NetworkPolicy and a ClusterNetworkPolicy are
// each in several slices and some slice holds rules and no pod (what makes
// the chunk size matter).
func (e *awsEnv) checkSliced(what string, chunkSize int) {
	t := e.t
	t.Helper()
	pe, cpe, rulesNoPods := e.slices()
	most := func(m map[string]int) (string, int) {
		best, n := "", 0
		for _, k := range awsSortedKeys(m) {
			if m[k] > n {
				best, n = k, m[k]
			}
		}
		return best, n
	}
	total := func(m map[string]int) int {
		n := 0
		for _, v := range m {
			n += v
		}
		return n
	}
	peMost, peN := most(pe)
	cpeMost, cpeN := most(cpe)
	t.Logf("%s: chunk size %d: %d PolicyEndpoints of %d policies (most: %s in %d), %d ClusterPolicyEndpoints of %d (most: %s in %d), %d slices with rules and no pod",
		what, chunkSize, total(pe), len(pe), peMost, peN, total(cpe), len(cpe), cpeMost, cpeN, rulesNoPods)
	if chunkSize <= 2 && (peN < 2 || cpeN < 2 || rulesNoPods == 0) {
		t.Errorf("%s: at chunk size %d the controller should cut policies into slices (a PolicyEndpoint parent in %d, a ClusterPolicyEndpoint parent in %d, %d slices with rules and no pod)",
			what, chunkSize, peN, cpeN, rulesNoPods)
	}
}

// reslice stops the controller, deletes every object it wrote (the agent
// sees them go), and starts it again at chunkSize: it writes every object
// again, cut in slices of the new size. It returns the write count before
// the restart.
func (e *awsEnv) reslice(chunkSize int) int {
	t := e.t
	t.Helper()
	e.ctl.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, store := range []cache.Store{e.writes.pes, e.writes.cpes} {
		for _, o := range store.List() {
			u := o.(*unstructured.Unstructured)
			ri, _, err := e.cluster.ResourceFor(u)
			if err == nil {
				err = ri.Delete(ctx, u.GetName(), awsDeleteNow)
			}
			if err != nil && !apierrors.IsNotFound(err) {
				t.Fatalf("delete the controller's %s %s/%s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
			}
		}
	}
	// Wait until the watch has seen them go, so that the writes counted
	// from here are the restarted controller's.
	deadline := time.Now().Add(time.Minute)
	for len(e.writes.pes.List())+len(e.writes.cpes.List()) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the deleted PolicyEndpoints and ClusterPolicyEndpoints are still watched")
		}
		time.Sleep(20 * time.Millisecond)
	}
	before, _ := e.writes.snapshot()
	e.ctl.Restart(t, chunkSize)
	return before
}

var awsDeleteNow = metav1.DeleteOptions{}

// awsAllPackets sends the packet of every case that can have one.
func awsAllPackets(*awsRow) bool { return true }

// awsPacketSample picks the packets of a churn step: those of the cases the
// step names, those whose reference changed with the step, and a third of
// the others (by a hash of the case, the same third every step).
func awsPacketSample(step []awsCase, before map[awsQuery]awsAnswer) func(*awsRow) bool {
	return func(r *awsRow) bool {
		if slices.Contains(step, r.k) {
			return true
		}
		if old, ok := before[r.q]; !ok || old.Allow != r.ref.Allow {
			return true
		}
		h := fnv.New32a()
		h.Write([]byte(r.k.String()))
		return h.Sum32()%3 == 0
	}
}

// waitAttached waits until the programs are on the device of every pod of
// this node (before packets are judged).
func (e *awsEnv) waitAttached() {
	e.t.Helper()
	n := 0
	for _, p := range e.world.Pods {
		if p.Local {
			n++
		}
	}
	waitAttached(e.agent, n)
}
