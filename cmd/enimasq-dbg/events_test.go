package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap/netpolicy/enforce"
)

// agentOnSocket serves handler on a unix socket, as the agent's API.
func agentOnSocket(t *testing.T, handler http.Handler) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "enimasq.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(handler)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return socket
}

func runDbg(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

var testEvents = []enforce.Event{
	{
		Time: time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC), Direction: "egress",
		Pod: netip.MustParseAddr("10.0.0.5"), Peer: netip.MustParseAddr("10.9.1.1"), Protocol: 17, SrcPort: 40000, DstPort: 53,
		Step: "admin", Object: "ClusterPolicyEndpoint/deny-all", ObjectID: 77,
		Reason: policybpf.PolicyAdminDeny, ReasonText: policybpf.PolicyAdminDeny.String(), Device: "enq1234", Ifindex: 42,
	},
	{
		Time: time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC), Direction: "ingress",
		Pod: netip.MustParseAddr("2001:db8::5"), Peer: netip.MustParseAddr("2001:db8::9"), Protocol: 58,
		Step: "namespace", Reason: policybpf.PolicyDenied, ReasonText: policybpf.PolicyDenied.String(), Ifindex: 42,
	},
	{
		Time: time.Date(2026, 1, 2, 3, 4, 7, 0, time.UTC), Direction: "egress", Protocol: 6, DstPort: 80,
		Pod: netip.MustParseAddr("10.0.0.5"), Peer: netip.MustParseAddr("8.8.8.8"),
		Step: "baseline", ObjectID: 99, Reason: policybpf.PolicyBaselineDeny, ReasonText: policybpf.PolicyBaselineDeny.String(), Ifindex: 42,
	},
	{Time: time.Date(2026, 1, 2, 3, 4, 8, 0, time.UTC), Direction: "egress", Step: "none", Reason: policybpf.PolicyMalformed, ReasonText: policybpf.PolicyMalformed.String()},
}

// eventsAgent serves the test events as the agent does; following, it
// ends the stream after them (as an agent that stops).
func eventsAgent(follows *[]bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+enforce.EventsPath, func(w http.ResponseWriter, r *http.Request) {
		*follows = append(*follows, r.URL.Query().Get("follow") != "false")
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, ev := range testEvents {
			enc.Encode(ev)
			w.(http.Flusher).Flush()
		}
	})
	return mux
}

func TestPolicyEvents(t *testing.T) {
	t.Setenv("TZ", "UTC")
	var follows []bool
	socket := agentOnSocket(t, eventsAgent(&follows))

	out, err := runDbg(t, "--socket", socket, "policy", "events", "--follow=false")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	want := []string{
		"2026-01-02T03:04:05.006Z egress  10.0.0.5        10.9.1.1        udp/53     admin     ClusterPolicyEndpoint/deny-all denied by an Admin-tier rule",
		"2026-01-02T03:04:06.000Z ingress 2001:db8::5     2001:db8::9     icmpv6     namespace - isolated, and no NetworkPolicy rule allows",
		"2026-01-02T03:04:07.000Z egress  10.0.0.5        8.8.8.8         tcp/80     baseline  #99 denied by a Baseline-tier rule",
		"2026-01-02T03:04:08.000Z egress  -               -               -          none      - " + policybpf.PolicyMalformed.String(),
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d:\n%q\nwant\n%q", i, lines[i], want[i])
		}
	}
	if len(follows) != 1 || follows[0] {
		t.Errorf("--follow=false asked follow %v", follows)
	}

	// Following: the same, and an error when the agent ends the stream.
	out, err = runDbg(t, "--socket", socket, "policy", "events")
	if err == nil || !strings.Contains(err.Error(), "the agent ended the stream") || exitCodeOf(err) != exitFailed {
		t.Errorf("following, the stream ends: %v", err)
	}
	if strings.Count(out, "\n") != len(want) || len(follows) != 2 || !follows[1] {
		t.Errorf("following: %v\n%s", follows, out)
	}

	// -o json: one object a line, as the agent sent them.
	out, err = runDbg(t, "--socket", socket, "policy", "events", "--follow=false", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(testEvents) {
		t.Fatalf("-o json: %d lines:\n%s", len(lines), out)
	}
	for i, line := range lines {
		var ev enforce.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil || !ev.Time.Equal(testEvents[i].Time) || ev.Pod != testEvents[i].Pod || ev.Object != testEvents[i].Object {
			t.Errorf("-o json line %d: %s %v", i, line, err)
		}
	}
	if !strings.Contains(lines[0], `"objectId":77,"reason":13,"reasonText":"denied by an Admin-tier rule","device":"enq1234"`) {
		t.Errorf("-o json: %s", lines[0])
	}

	// -o yaml: a document each.
	out, err = runDbg(t, "--socket", socket, "policy", "events", "--follow=false", "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(out, "---\n")
	if len(docs) != len(testEvents) {
		t.Fatalf("-o yaml: %d documents:\n%s", len(docs), out)
	}
	var first map[string]any
	if err := yaml.Unmarshal([]byte(docs[0]), &first); err != nil || first["object"] != "ClusterPolicyEndpoint/deny-all" || first["step"] != "admin" {
		t.Errorf("-o yaml: %v %v", first, err)
	}
}

func TestPolicyEventsErrors(t *testing.T) {
	// Events off: the agent's error says what to do.
	off := agentOnSocket(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":"the policy programs report no events: start the agent with --policy-event-logs","reason":"events-off"}` + "\n"))
	}))
	_, err := runDbg(t, "--socket", off, "policy", "events")
	if err == nil || !strings.Contains(err.Error(), "start the agent with --policy-event-logs (events-off, 404)") || exitCodeOf(err) != exitFailed {
		t.Errorf("events off: %v (exit %d)", err, exitCodeOf(err))
	}

	// An agent without the API.
	old := agentOnSocket(t, http.NewServeMux())
	if _, err := runDbg(t, "--socket", old, "policy", "events", "--follow=false"); err == nil || !strings.Contains(err.Error(), "no policy events API") {
		t.Errorf("an older agent: %v", err)
	}

	// No agent: exit 2.
	_, err = runDbg(t, "--socket", filepath.Join(t.TempDir(), "none.sock"), "policy", "events")
	if err == nil || exitCodeOf(err) != exitUnreachable || !strings.Contains(err.Error(), "enimasq-agent is not running") {
		t.Errorf("no agent: %v (exit %d)", err, exitCodeOf(err))
	}

	if _, err := runDbg(t, "--socket", old, "policy", "events", "-o", "xml"); err == nil || !strings.Contains(err.Error(), `--output "xml"`) {
		t.Errorf("-o xml: %v", err)
	}
}

// syncWriter is an output the command and the test share.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestPolicyEventsFollowsUntilInterrupted: following, each event is
// printed as it comes; an interrupt ends it, exit 0.
func TestPolicyEventsFollowsUntilInterrupted(t *testing.T) {
	sent := make(chan struct{})
	socket := agentOnSocket(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		json.NewEncoder(w).Encode(testEvents[0])
		w.(http.Flusher).Flush()
		close(sent)
		<-r.Context().Done()
	}))
	var out syncWriter
	done := make(chan error)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- streamPolicyEvents(ctx, socket, true, &out, "") }()
	<-sent
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "ClusterPolicyEndpoint/deny-all") {
		if time.Now().After(deadline) {
			t.Fatalf("no line printed: %q", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// An interrupt ends it without an error.
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("interrupted: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still following after the interrupt")
	}
}
