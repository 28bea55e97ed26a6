package test

// A property of the attachments, under random interleavings of ADD, DEL,
// CHECK and GC with kill -9 restarts of the agent: never two live
// attachments with one IP, the agent's allocations are the model's, and
// the kernel's rules are the allocations' once they converge.

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

var propertySeed = flag.Uint64("property.seed", 0,
	"seed of TestPrivilegedCNIAttachProperty (0: $ENIMASQ_PROPERTY_SEED, else the clock)")

// The property test's parameters.
const (
	propAttachments  = 1000 // attachments added over the run
	propPods         = 50   // pod names they belong to
	propPool         = 32   // pool IPs (one is the API's anchor allocation)
	propSlots        = 6    // pod netns for attachments driven through the plugin
	propPluginShare  = 0.15 // share of new attachments driven through the plugin
	propRestartEvery = 50   // steps between kill -9 restarts (on average)
)

func propertySeedValue(t *testing.T) uint64 {
	if *propertySeed != 0 {
		return *propertySeed
	}
	if s := os.Getenv("ENIMASQ_PROPERTY_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("ENIMASQ_PROPERTY_SEED=%q: %v", s, err)
		}
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// propAttachment is one attachment of the model.
type propAttachment struct {
	id   string // container ID; the interface is eth0
	pod  podRef
	ip   string
	slot int // the pod netns slot when driven through the plugin, else -1
}

func (at *propAttachment) plugin() bool { return at.slot >= 0 }

type propertyRun struct {
	t    *testing.T
	rng  *rand.Rand
	topo *vpcTopology
	a    *Agent
	api  *apiClient
	cni  *libCNI
	// slots are pod netns; slotUsed[i] is the live attachment in slot i.
	slots    []string
	slotUsed []*propAttachment

	anchor  string // the API's allocation, which GC never takes
	live    map[string]*propAttachment
	dead    []*propAttachment // deleted or collected: a DEL of one is stale
	added   int
	step    int
	history []string
	counts  map[string]int
	logs    []string // the logs of the agents killed so far
}

func (r *propertyRun) logf(format string, args ...any) {
	r.history = append(r.history, fmt.Sprintf("step %d: ", r.step)+fmt.Sprintf(format, args...))
	if len(r.history) > 40 {
		r.history = r.history[1:]
	}
}

func (r *propertyRun) fatalf(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("step %d: %s", r.step, fmt.Sprintf(format, args...))
}

func (r *propertyRun) rt(at *propAttachment) *libcni.RuntimeConf {
	ns := ""
	if at.plugin() {
		ns = r.slots[at.slot]
	}
	return runtimeConf(at.id, "eth0", ns, at.pod)
}

// freeIPs is how many pool IPs the attachments may still take.
func (r *propertyRun) freeIPs() int { return propPool - 1 - len(r.live) }

func (r *propertyRun) addNew() {
	i := r.added
	r.added++
	p := r.rng.IntN(propPods)
	at := &propAttachment{
		id:   fmt.Sprintf("prop-%04d", i),
		pod:  podRef{"shop", fmt.Sprintf("pod-%d", p), fmt.Sprintf("00000000-0000-4000-8000-%06d%06d", p, i)},
		slot: -1,
	}
	if r.rng.Float64() < propPluginShare {
		at.slot = slices.Index(r.slotUsed, nil)
	}
	full := r.freeIPs() == 0
	var ip string
	if at.plugin() {
		r.counts["add-plugin"]++
		var err error
		ip, err = r.cni.add(r.rt(at))
		switch {
		case full && err != nil && strings.Contains(err.Error(), "pool exhausted"):
			r.counts["add-exhausted"]++
			r.logf("ADD %s (plugin): pool exhausted", at.id)
			r.dead = append(r.dead, at)
			return
		case err != nil || full:
			r.fatalf("ADD %s through the plugin with %d IPs free: %q %v", at.id, r.freeIPs(), ip, err)
		}
	} else {
		r.counts["add-api"]++
		code, body, res := r.allocate(at)
		switch {
		case full && code == http.StatusServiceUnavailable && strings.Contains(string(body), "pool-exhausted"):
			r.counts["add-exhausted"]++
			r.logf("ADD %s: pool exhausted", at.id)
			r.dead = append(r.dead, at)
			return
		case code != http.StatusCreated || full:
			r.fatalf("ADD %s with %d IPs free: %d %s", at.id, r.freeIPs(), code, body)
		}
		ip = res
	}
	if ip == r.anchor {
		r.fatalf("ADD %s got the API's %s", at.id, ip)
	}
	for _, other := range r.live {
		if other.ip == ip {
			r.fatalf("ADD %s got %s, which %s holds", at.id, ip, other.id)
		}
	}
	at.ip = ip
	r.live[at.id] = at
	if at.plugin() {
		r.slotUsed[at.slot] = at
	}
	r.logf("ADD %s (%s, slot %d) = %s", at.id, at.pod.Name, at.slot, ip)
}

// allocate is the ADD of the agent API: it returns the status, the body
// and the IP. A not-ready agent (its CiliumNode or ip-masq-agent config
// being read after a restart) is asked again.
func (r *propertyRun) allocate(at *propAttachment) (int, []byte, string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var res struct{ IP string }
		code, body, err := r.api.do(http.MethodPost, "/v1/ipam?wait=true&timeout=10s", map[string]string{
			"owner": at.pod.Namespace + "/" + at.pod.Name, "podUID": at.pod.UID, "network": "enimasq", "containerID": at.id, "ifname": "eth0",
		}, &res)
		if err != nil {
			r.fatalf("POST /v1/ipam for %s: %v", at.id, err)
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "not-ready") || time.Now().After(deadline) {
			return code, body, res.IP
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *propertyRun) pickLive() *propAttachment {
	if len(r.live) == 0 {
		return nil
	}
	ids := slices.Sorted(maps.Keys(r.live))
	return r.live[ids[r.rng.IntN(len(ids))]]
}

// reAdd is a retried ADD of a live attachment: the same IP, 200.
func (r *propertyRun) reAdd() {
	at := r.pickLive()
	if at == nil {
		return
	}
	r.counts["re-add"]++
	code, body, ip := r.allocate(at)
	if code != http.StatusOK || ip != at.ip {
		r.fatalf("ADD again of %s (holds %s): %d %s", at.id, at.ip, code, body)
	}
	r.logf("ADD again %s = %s", at.id, ip)
}

func (r *propertyRun) forget(at *propAttachment) {
	delete(r.live, at.id)
	if at.plugin() {
		r.slotUsed[at.slot] = nil
	}
	r.dead = append(r.dead, at)
}

func (r *propertyRun) delLive() {
	at := r.pickLive()
	if at == nil {
		return
	}
	if at.plugin() {
		r.counts["del-plugin"]++
		if err := r.cni.del(r.rt(at)); err != nil {
			r.fatalf("DEL %s through the plugin: %v", at.id, err)
		}
	} else {
		r.counts["del-api"]++
		released := r.release(at.id)
		if len(released) != 1 || released[0].IP != at.ip {
			r.fatalf("DEL %s (holds %s) released %+v", at.id, at.ip, released)
		}
	}
	r.forget(at)
	r.logf("DEL %s (%s)", at.id, at.ip)
}

func (r *propertyRun) release(id string) []allocationRow {
	var released []allocationRow
	code, body, err := r.api.do(http.MethodPost, "/v1/ipam/release", map[string]string{"network": "enimasq", "containerID": id, "ifname": "eth0"}, &released)
	if err != nil || code != http.StatusOK {
		r.fatalf("release %s: %d %v %s", id, code, err, body)
	}
	return released
}

// delStale is a DEL of an attachment deleted already, collected, never
// allocated, or never added, of a pod that may have live attachments: it
// releases nothing.
func (r *propertyRun) delStale() {
	at := &propAttachment{id: fmt.Sprintf("ghost-%d", r.step), pod: podRef{"shop", fmt.Sprintf("pod-%d", r.rng.IntN(propPods)), ""}, slot: -1}
	if len(r.dead) > 0 && r.rng.IntN(4) > 0 {
		at = r.dead[r.rng.IntN(len(r.dead))]
	}
	if r.rng.IntN(3) == 0 {
		r.counts["del-stale-plugin"]++
		if err := r.cni.del(runtimeConf(at.id, "eth0", "", at.pod)); err != nil {
			r.fatalf("stale DEL %s through the plugin: %v", at.id, err)
		}
	} else {
		r.counts["del-stale-api"]++
		if released := r.release(at.id); len(released) != 0 {
			r.fatalf("stale DEL %s released %+v", at.id, released)
		}
	}
	r.logf("DEL (stale) %s", at.id)
}

func (r *propertyRun) check() {
	at := r.pickLive()
	if at == nil {
		return
	}
	if at.plugin() {
		r.counts["check-plugin"]++
		if err := r.cni.check(r.rt(at)); err != nil {
			r.fatalf("CHECK %s (%s): %v", at.id, at.ip, err)
		}
	} else {
		r.counts["check-api"]++
		rows := r.api.list(r.t, "?containerID="+at.id+"&ifname=eth0")
		if len(rows) != 1 || rows[0].IP != at.ip {
			r.fatalf("CHECK %s (%s): the agent holds %+v", at.id, at.ip, rows)
		}
	}
	r.logf("CHECK %s", at.id)
}

// gc keeps a random part of the live attachments (and names a few dead
// ones as valid, which changes nothing), through libcni with or without
// its cache (with it, libcni first DELs the cached attachments not valid).
func (r *propertyRun) gc() {
	keepShare := []float64{0, 0.5, 0.8, 1}[r.rng.IntN(4)]
	var valid []types.GCAttachment
	keep := map[string]bool{}
	for _, id := range slices.Sorted(maps.Keys(r.live)) {
		if r.rng.Float64() < keepShare {
			keep[id] = true
			valid = append(valid, types.GCAttachment{ContainerID: id, IfName: "eth0"})
		}
	}
	for range 3 {
		if len(r.dead) > 0 {
			valid = append(valid, types.GCAttachment{ContainerID: r.dead[r.rng.IntN(len(r.dead))].id, IfName: "eth0"})
		}
	}
	cni := r.cni
	if r.rng.IntN(2) == 0 {
		cni = r.cni.withoutCache()
		r.counts["gc"]++
	} else {
		r.counts["gc-cached"]++
	}
	if err := cni.gc(valid); err != nil {
		r.fatalf("GC keeping %d of %d: %v", len(keep), len(r.live), err)
	}
	n := len(r.live)
	for _, id := range slices.Sorted(maps.Keys(r.live)) {
		if !keep[id] {
			r.forget(r.live[id])
		}
	}
	r.logf("GC kept %d of %d", len(keep), n)
}

// restart kills the agent with SIGKILL and starts it again on the same
// state dir and netns, and waits until it has restored its checkpoint and
// read the CiliumNode (the anchor allocation is Allocated again).
func (r *propertyRun) restart() {
	r.counts["kill -9"]++
	r.a.Kill9()
	r.logs = append(r.logs, r.a.Log())
	if len(r.logs) > 2 {
		r.logs = r.logs[1:]
	}
	a := r.a
	a.cmd = a.Command()
	a.stderr = &syncBuffer{}
	a.cmd.Stdout, a.cmd.Stderr = a.stderr, a.stderr
	if err := a.cmd.Start(); err != nil {
		r.fatalf("restart the agent: %v", err)
	}
	a.exited = make(chan struct{})
	cmd, exited := a.cmd, a.exited
	go func() {
		a.err = cmd.Wait()
		close(exited)
	}()
	// Killed at cleanup by the first Start's cleanup, which kills a.cmd.
	a.WaitFor("the checkpoint restored and the CiliumNode read", func() bool {
		var rows []allocationRow
		code, _, err := r.api.do(http.MethodGet, "/v1/ipam", nil, &rows)
		if err != nil || code != http.StatusOK {
			return false
		}
		return slices.ContainsFunc(rows, func(row allocationRow) bool { return row.IP == r.anchor && row.State == "Allocated" })
	})
	r.logf("kill -9, restarted")
}

// verify compares the agent and the kernel with the model.
func (r *propertyRun) verify() {
	r.t.Helper()
	want := map[string]string{} // container ID -> IP
	ips := map[string]bool{r.anchor: true}
	for id, at := range r.live {
		want[id] = at.ip
		if ips[at.ip] {
			r.fatalf("the model has two attachments with %s", at.ip)
		}
		ips[at.ip] = true
	}
	got := map[string]string{}
	seen := map[string]bool{}
	anchor := false
	for _, row := range r.api.list(r.t, "") {
		if seen[row.IP] {
			r.fatalf("the agent lists %s twice", row.IP)
		}
		seen[row.IP] = true
		if row.ContainerID == "" {
			anchor = anchor || (row.IP == r.anchor && row.Owner == "kube-system/anchor")
			if row.IP != r.anchor {
				r.fatalf("the agent holds %+v without an attachment", row)
			}
			continue
		}
		if at := r.live[row.ContainerID]; at != nil && (row.Owner != at.pod.Namespace+"/"+at.pod.Name || row.PodUID != at.pod.UID || row.IfName != "eth0") {
			r.fatalf("the agent holds %+v for %+v", row, at)
		}
		got[row.ContainerID] = row.IP
	}
	if !anchor {
		r.fatalf("the API's allocation %s is gone", r.anchor)
	}
	if !maps.Equal(got, want) {
		var diff []string
		for _, id := range slices.Sorted(maps.Keys(want)) {
			if got[id] != want[id] {
				diff = append(diff, fmt.Sprintf("%s: agent %q, model %q", id, got[id], want[id]))
			}
		}
		for _, id := range slices.Sorted(maps.Keys(got)) {
			if _, ok := want[id]; !ok {
				diff = append(diff, fmt.Sprintf("%s: agent %q, model none", id, got[id]))
			}
		}
		r.fatalf("the agent's allocations differ from the model's:\n%s", strings.Join(diff, "\n"))
	}

	// The host veths are those of the live attachments of the plugin.
	var wantLinks []string
	for _, at := range r.live {
		if at.plugin() {
			wantLinks = append(wantLinks, hostVethName(at.id, "eth0"))
		}
	}
	slices.Sort(wantLinks)
	links := r.topo.links("lxc")
	slices.Sort(links)
	if !slices.Equal(links, wantLinks) {
		r.fatalf("host veths %v, want %v", links, wantLinks)
	}

	// The agent removes rules after answering: wait for them to converge.
	deadline := time.Now().Add(15 * time.Second)
	for {
		from, to, err := r.topo.podRules()
		if err != nil {
			r.fatalf("ip rules: %v", err)
		}
		if maps.Equal(from, ips) && maps.Equal(to, ips) {
			return
		}
		select {
		case <-r.a.exited:
			r.fatalf("the agent exited: %v", r.a.err)
		default:
		}
		if time.Now().After(deadline) {
			r.fatalf("ip rules do not converge: egress %v, ingress %v, want %v", slices.Sorted(maps.Keys(from)), slices.Sorted(maps.Keys(to)), slices.Sorted(maps.Keys(ips)))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestPrivilegedCNIAttachProperty(t *testing.T) {
	topo := newVPCTopology(t)
	a, _ := cniAgent(t, topo, poolCiliumNode(t, propPool), sample(t, "ip-masq-agent.yaml"))
	seed := propertySeedValue(t)
	r := &propertyRun{
		t: t, rng: rand.New(rand.NewPCG(seed, seed)), topo: topo, a: a,
		api: newAPIClient(a.APISocket()), cni: newLibCNI(t, topo, a.APISocket()),
		live: map[string]*propAttachment{}, counts: map[string]int{},
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (rerun: go test ./test/ -run TestPrivilegedCNIAttachProperty -property.seed=%d); last steps:\n%s",
				seed, seed, strings.Join(r.history, "\n"))
			for i, l := range r.logs {
				t.Logf("log of killed agent %d:\n%s", i, l)
			}
		}
	})
	pods := newCNIRuntime(t, topo, a.APISocket())
	for i := range propSlots {
		r.slots = append(r.slots, pods.newPod(fmt.Sprintf("slot%d", i)))
	}
	r.slotUsed = make([]*propAttachment, propSlots)

	var anchor struct{ IP string }
	if code, body, err := r.api.do(http.MethodPost, "/v1/ipam", map[string]string{"owner": "kube-system/anchor"}, &anchor); err != nil || code != http.StatusCreated {
		t.Fatalf("anchor allocation: %d %v %s", code, err, body)
	}
	r.anchor = anchor.IP

	start := time.Now()
	for r.step = 1; r.added < propAttachments; r.step++ {
		switch n := r.rng.IntN(100); {
		case n < 45:
			r.addNew()
		case n < 53:
			r.reAdd()
		case n < 70:
			r.delLive()
		case n < 75:
			r.delStale()
		case n < 97:
			r.check()
		default:
			r.gc()
		}
		if r.rng.IntN(propRestartEvery) == 0 {
			r.restart()
		}
		r.verify()
	}
	t.Logf("seed %d: %d steps, %d attachments, %s; %v", seed, r.step-1, r.added, time.Since(start).Round(time.Millisecond), r.counts)
}
