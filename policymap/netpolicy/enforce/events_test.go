package enforce

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/agentapi"
	"github.com/enimasq/enimasq/cells/celltest"
)

// syncBuffer is a log sink that the reader and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testHealth records the last status.
type testHealth struct {
	mu   sync.Mutex
	last string
}

func (h *testHealth) set(s string) {
	h.mu.Lock()
	h.last = s
	h.mu.Unlock()
}
func (h *testHealth) OK(status string)      { h.set("OK " + status) }
func (h *testHealth) Stopped(reason string) { h.set("stopped " + reason) }
func (h *testHealth) Degraded(reason string, err error) {
	h.set(fmt.Sprintf("degraded %s: %v", reason, err))
}
func (h *testHealth) NewScope(string) cell.Health { return h }
func (h *testHealth) Close()                      {}
func (h *testHealth) status() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

const adminDenyAll = 77

// testNames names the Admin object 77, and the PolicyEndpoint of a
// NetworkPolicy denial.
func testNames(_ policybpf.Direction, q VerdictQuery, res policybpf.PolicyResult) string {
	switch {
	case res.Object == adminDenyAll:
		return "ClusterPolicyEndpoint/deny-all"
	case res.Step == policybpf.StepNamespace && !res.Allow:
		return "PolicyEndpoint/shop/web-" + q.Pod.String()
	}
	return ""
}

type eventsEnv struct {
	t      *testing.T
	db     *statedb.DB
	table  statedb.RWTable[*Attachment]
	events *Events
	log    *syncBuffer
}

func newEventsEnv(t *testing.T, s Settings, names ObjectNames) *eventsEnv {
	t.Helper()
	db := statedb.New()
	table, err := NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	env := &eventsEnv{t: t, db: db, table: table, log: &syncBuffer{}}
	env.events = newEvents(eventsParams{
		Log: slog.New(slog.NewTextHandler(env.log, nil)), Settings: s, DB: db, Table: table, Names: names,
	})
	env.events.now = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }
	return env
}

func (env *eventsEnv) attach(device string, ifindex int) {
	wtxn := env.db.WriteTxn(env.table)
	env.table.Insert(wtxn, &Attachment{Device: device, Ifindex: ifindex})
	wtxn.Commit()
}

func testEvent(t *testing.T, dir policybpf.Direction, pod, peer string, proto uint8, dport uint16, step policybpf.PolicyStep, reason policybpf.PolicyReason, object uint32, ifindex uint32) []byte {
	t.Helper()
	src, dst := netip.MustParseAddr(pod), netip.MustParseAddr(peer)
	if dir == policybpf.Ingress {
		src, dst = dst, src
	}
	b, err := policybpf.PolicyEvent{Src: src, Dst: dst, Ifindex: ifindex, Object: object, SrcPort: 40000, DstPort: dport,
		Protocol: proto, Direction: dir, Step: step, Reason: reason}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var eventsOn = Settings{Events: true, Mode: policybpf.PolicyModeStandard}

func TestEventsHandle(t *testing.T) {
	env := newEventsEnv(t, eventsOn, testNames)
	env.attach("enq1234", 42)
	e := env.events
	for _, raw := range [][]byte{
		testEvent(t, policybpf.Egress, "10.0.0.5", "10.9.1.1", 17, 53, policybpf.StepAdmin, policybpf.PolicyAdminDeny, adminDenyAll, 42),
		testEvent(t, policybpf.Ingress, "10.0.0.5", "10.1.2.3", 6, 8080, policybpf.StepNamespace, policybpf.PolicyDenied, 0, 42),
		testEvent(t, policybpf.Egress, "10.0.0.6", "8.8.8.8", 6, 443, policybpf.StepBaseline, policybpf.PolicyBaselineDeny, 99, 43),
	} {
		if err := e.handle(raw); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.handle(make([]byte, 10)); err == nil || !strings.Contains(err.Error(), "of 10 bytes") {
		t.Errorf("a record of 10 bytes: %v", err)
	}
	kept := e.Kept()
	if len(kept) != 3 {
		t.Fatalf("%d events kept, want 3", len(kept))
	}
	want := Event{
		Time: e.now(), Direction: "egress", Pod: netip.MustParseAddr("10.0.0.5"), Peer: netip.MustParseAddr("10.9.1.1"),
		Protocol: 17, SrcPort: 40000, DstPort: 53, Step: "admin", Object: "ClusterPolicyEndpoint/deny-all", ObjectID: adminDenyAll,
		Reason: policybpf.PolicyAdminDeny, ReasonText: policybpf.PolicyAdminDeny.String(), Device: "enq1234", Ifindex: 42,
	}
	if kept[0] != want {
		t.Errorf("admin deny:\n%+v, want\n%+v", kept[0], want)
	}
	if k := kept[1]; k.Direction != "ingress" || k.Pod != netip.MustParseAddr("10.0.0.5") || k.Peer != netip.MustParseAddr("10.1.2.3") ||
		k.SrcPort != 40000 || k.DstPort != 8080 || k.Object != "PolicyEndpoint/shop/web-10.0.0.5" || k.ObjectID != 0 {
		t.Errorf("ingress NetworkPolicy deny: %+v", k)
	}
	// A device the agent did not attach to has no name; one attached
	// since is found.
	if kept[2].Device != "" || kept[2].Object != "" || kept[2].ObjectID != 99 {
		t.Errorf("unknown device: %+v", kept[2])
	}
	env.attach("enq5678", 43)
	e.handle(testEvent(t, policybpf.Egress, "10.0.0.6", "8.8.8.8", 6, 443, policybpf.StepBaseline, policybpf.PolicyBaselineDeny, 99, 43))
	if d := e.Kept()[3].Device; d != "enq5678" {
		t.Errorf("a device attached since: %q", d)
	}

	log := env.log.String()
	for _, want := range []string{
		`msg="Policy denied" pod=10.0.0.5 peer=10.9.1.1 protocol=udp sport=40000 dport=53 direction=egress step=admin object=ClusterPolicyEndpoint/deny-all reason="denied by an Admin-tier rule" device=enq1234`,
		`pod=10.0.0.5 peer=10.1.2.3 protocol=tcp sport=40000 dport=8080 direction=ingress step=namespace object=PolicyEndpoint/shop/web-10.0.0.5`,
		// Without a name, the object's id.
		`step=baseline object=#99 reason="denied by a Baseline-tier rule" device=""`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log has no %s:\n%s", want, log)
		}
	}
	if n := strings.Count(log, `msg="Policy denied"`); n != 4 {
		t.Errorf("%d denied packets logged, want 4", n)
	}
}

func TestEventsWithoutObjectNames(t *testing.T) {
	env := newEventsEnv(t, eventsOn, nil)
	e := env.events
	e.handle(testEvent(t, policybpf.Egress, "10.0.0.5", "10.9.1.1", 17, 53, policybpf.StepAdmin, policybpf.PolicyAdminDeny, adminDenyAll, 42))
	e.handle(testEvent(t, policybpf.Egress, "10.0.0.5", "10.9.1.1", 6, 80, policybpf.StepDefault, policybpf.PolicyStrict, 0, 42))
	// A frame that is not IP: no addresses, no step.
	raw, _ := policybpf.PolicyEvent{Direction: policybpf.Egress, Reason: policybpf.PolicyMalformed, Ifindex: 42}.MarshalBinary()
	e.handle(raw)
	kept := e.Kept()
	if kept[0].Object != "" || kept[0].ObjectID != adminDenyAll {
		t.Errorf("%+v", kept[0])
	}
	if kept[2].Step != "none" || kept[2].Pod.IsValid() || kept[2].Reason != policybpf.PolicyMalformed {
		t.Errorf("not IP: %+v", kept[2])
	}
	log := env.log.String()
	for _, want := range []string{"step=admin object=#77 ", "step=default object=\"\" reason=\"no policy selects the pod (strict mode)\"", "step=none"} {
		if !strings.Contains(log, want) {
			t.Errorf("log has no %s:\n%s", want, log)
		}
	}
}

func TestEventsKeepTheLast(t *testing.T) {
	e := newEventsEnv(t, eventsOn, nil).events
	e.log = slog.New(slog.DiscardHandler)
	for i := range EventsKept + 10 {
		e.publish(Event{Ifindex: uint32(i)})
	}
	kept := e.Kept()
	if len(kept) != EventsKept {
		t.Fatalf("%d kept, want %d", len(kept), EventsKept)
	}
	for i, ev := range kept {
		if ev.Ifindex != uint32(i+10) {
			t.Fatalf("kept[%d] is event %d, want %d (oldest first)", i, ev.Ifindex, i+10)
		}
	}
}

func TestEventsSlowSubscriberMisses(t *testing.T) {
	e := newEventsEnv(t, eventsOn, nil).events
	kept, sub := e.subscribe()
	if len(kept) != 0 {
		t.Fatal(kept)
	}
	for i := range subscriberBuffer + 3 {
		e.publish(Event{Ifindex: uint32(i)})
	}
	for i := range subscriberBuffer {
		if ev := <-sub.ch; ev.Ifindex != uint32(i) || ev.Missed != 0 {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	e.publish(Event{Ifindex: 9999})
	if ev := <-sub.ch; ev.Ifindex != 9999 || ev.Missed != 3 {
		t.Errorf("after 3 missed: %+v", ev)
	}
	e.publish(Event{Ifindex: 10000})
	if ev := <-sub.ch; ev.Missed != 0 {
		t.Errorf("then: %+v", ev)
	}
	// Another subscriber gets what was kept, the last EventsKept.
	kept, _ = e.subscribe()
	if len(kept) != EventsKept || kept[len(kept)-1].Ifindex != 10000 {
		t.Errorf("%d kept, last %+v", len(kept), kept[len(kept)-1])
	}
}

func readEvents(t *testing.T, sc *bufio.Scanner, n int) []Event {
	t.Helper()
	var out []Event
	for len(out) < n && sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		out = append(out, ev)
	}
	if len(out) < n {
		t.Fatalf("%d events, want %d: %v", len(out), n, sc.Err())
	}
	return out
}

func TestEventsAPI(t *testing.T) {
	env := newEventsEnv(t, eventsOn, testNames)
	e := env.events
	e.started = true
	srv := httptest.NewServer(e)
	defer srv.Close()
	e.handle(testEvent(t, policybpf.Egress, "10.0.0.5", "10.9.1.1", 17, 53, policybpf.StepAdmin, policybpf.PolicyAdminDeny, adminDenyAll, 42))
	e.handle(testEvent(t, policybpf.Ingress, "2001:db8::5", "2001:db8::9", 6, 443, policybpf.StepNamespace, policybpf.PolicyDenied, 0, 42))

	// follow=false: the kept ones, then the end.
	resp, err := http.Get(srv.URL + "?follow=false")
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "application/x-ndjson" {
		t.Fatalf("%s %s", resp.Status, ct)
	}
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	resp.Body.Close()
	if len(lines) != 2 || !strings.Contains(lines[0], `"object":"ClusterPolicyEndpoint/deny-all","objectId":77,"reason":13`) ||
		!strings.Contains(lines[1], `"direction":"ingress","pod":"2001:db8::5","peer":"2001:db8::9","protocol":6,"sport":40000,"dport":443,"step":"namespace"`) {
		t.Errorf("follow=false:\n%s", strings.Join(lines, "\n"))
	}

	// Following: the kept ones, then each new one as it comes, until the
	// client goes.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc = bufio.NewScanner(resp.Body)
	if got := readEvents(t, sc, 2); got[0].Step != "admin" || got[1].Step != "namespace" {
		t.Errorf("kept: %+v", got)
	}
	e.handle(testEvent(t, policybpf.Egress, "10.0.0.5", "8.8.8.8", 6, 80, policybpf.StepDefault, policybpf.PolicyStrict, 0, 42))
	if got := readEvents(t, sc, 1); got[0].Peer != netip.MustParseAddr("8.8.8.8") || got[0].Reason != policybpf.PolicyStrict {
		t.Errorf("followed: %+v", got)
	}
	cancel()
	resp.Body.Close()
	waitFor(t, "the client's subscription to go", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.subs) == 0
	})

	// The reader's stop ends the streams.
	resp, err = http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readEvents(t, bufio.NewScanner(resp.Body), 3)
	e.stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end with the reader")
	}
	resp.Body.Close()

	resp, err = http.Get(srv.URL + "?follow=maybe")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("follow=maybe: %s", resp.Status)
	}
}

func TestEventsAPIOff(t *testing.T) {
	for _, tc := range []struct {
		s      Settings
		code   int
		reason string
		msg    string
	}{
		{Settings{}, 404, "events-off", "start the agent with --policy-event-logs"},
		{Settings{Off: "network policy is disabled", Events: true}, 404, "not-enforced", "no policy program runs (network policy is disabled)"},
		{Settings{Events: true}, 503, "not-started", "not read yet"},
	} {
		e := newEventsEnv(t, tc.s, nil).events
		// The API routes it, as the agent serves it.
		api := newAPI(nil, nil, nil, nil, tc.s, nil, &observers{events: e})
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, EventsPath+"?follow=false", nil))
		var body agentapi.Error
		json.Unmarshal(rec.Body.Bytes(), &body)
		if rec.Code != tc.code || body.Reason != tc.reason || !strings.Contains(body.Message, tc.msg) {
			t.Errorf("%+v: %d %s, want %d %s %q", tc.s, rec.Code, rec.Body.String(), tc.code, tc.reason, tc.msg)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// privilegedPrograms are the programs with their state pinned in a fresh
// bpffs, on placeholder policy maps.
func privilegedPrograms(t testing.TB, s Settings) (*programs, Settings) {
	t.Helper()
	s.GlobalsDir = filepath.Join(celltest.MountBPFFS(t), "globals")
	p := &programs{settings: s, maps: func(context.Context) (map[string]*ebpf.Map, error) { return map[string]*ebpf.Map{}, nil }}
	t.Cleanup(p.close)
	return p, s
}

// TestPrivilegedEvents reads the real ring buffer: a packet the program
// on the pinned state denies is logged, kept and served.
func TestPrivilegedEvents(t *testing.T) {
	celltest.RequireRoot(t)
	progs, s := privilegedPrograms(t, Settings{Mode: policybpf.PolicyModeStrict, Events: true})
	env := newEventsEnv(t, s, nil)
	e := env.events
	e.started = true
	ctx, cancel := context.WithCancel(context.Background())
	health := &testHealth{}
	stopped := make(chan error, 1)
	go func() { stopped <- e.run(ctx, health, progs.stateMap) }()
	stop := sync.OnceValue(func() error { cancel(); return <-stopped })
	t.Cleanup(func() { stop() })
	waitFor(t, "the reader", func() bool { return strings.HasPrefix(health.status(), "OK") })

	prog, err := progs.get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	frame, _ := policybpf.PolicyTestFrame(netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.1.2.3"), uint8(policybpf.ProtocolTCP), 40000, 8443)
	for range 3 {
		if res, err := prog.Run(policybpf.Egress, frame); err != nil || res.Allow || res.Reason != policybpf.PolicyStrict {
			t.Fatalf("strict mode, no policy: %+v %v", res, err)
		}
	}
	waitFor(t, "3 events", func() bool { return len(e.Kept()) == 3 })
	ev := e.Kept()[0]
	if ev.Direction != "egress" || ev.Pod != netip.MustParseAddr("10.0.0.5") || ev.Peer != netip.MustParseAddr("10.1.2.3") ||
		ev.DstPort != 8443 || ev.SrcPort != 40000 || ev.Step != "default" || ev.Reason != policybpf.PolicyStrict || ev.Ifindex == 0 {
		t.Errorf("%+v", ev)
	}
	if n := strings.Count(env.log.String(), `msg="Policy denied" pod=10.0.0.5 peer=10.1.2.3 protocol=tcp sport=40000 dport=8443 direction=egress step=default`); n != 3 {
		t.Errorf("%d denied packets logged, want 3:\n%s", n, env.log.String())
	}

	// The reader stops with its context, and the streams with it.
	if err := stop(); err != nil {
		t.Error(err)
	}
	select {
	case <-e.done:
	default:
		t.Error("the streams did not end with the reader")
	}
}
