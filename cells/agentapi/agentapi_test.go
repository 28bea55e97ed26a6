package agentapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The bodies are the wire format: the error body compact, the indented
// answers as a person reads them.
func TestWriters(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, http.StatusConflict, "ip-in-use", errors.New("held"))
	if rec.Code != 409 || rec.Body.String() != `{"error":"held","reason":"ip-in-use"}`+"\n" || rec.Header().Get("Content-Type") != "application/json" {
		t.Errorf("WriteError: %d %q %v", rec.Code, rec.Body.String(), rec.Header())
	}
	rec = httptest.NewRecorder()
	WriteJSONIndent(rec, http.StatusOK, map[string]int{"free": 3})
	if rec.Body.String() != "{\n  \"free\": 3\n}\n" {
		t.Errorf("WriteJSONIndent: %q", rec.Body.String())
	}
	rec = httptest.NewRecorder()
	s := NewStream(rec)
	s.Encode(1)
	s.Encode("two")
	if s.Flush() != nil || rec.Body.String() != "1\n\"two\"\n" || rec.Header().Get("Content-Type") != "application/x-ndjson" || !rec.Flushed {
		t.Errorf("Stream: %q %v", rec.Body.String(), rec.Header())
	}
}

func TestDecodeBody(t *testing.T) {
	type req struct {
		Owner string `json:"owner"`
	}
	for body, want := range map[string]string{
		`{"owner": "a"}`:                                "",
		`{"owner": "a", "owner": "b"}`:                  "owner",
		`{"owner": "a", "nope": 1}`:                     "nope",
		`{"owner": "a"} {"owner": "b"}`:                 "data after the first value",
		`{"owner": 1}`:                                  "owner",
		`{"owner": "` + strings.Repeat("a", 100) + `"}`: "larger than 64 bytes",
	} {
		var v req
		err := DecodeBody(httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body)), 64, &v, `{"owner": "..."}`)
		switch {
		case want == "" && (err != nil || v.Owner != "a"):
			t.Errorf("%s: %v %+v", body, err, v)
		case want != "" && (!errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v, want an invalid request naming %q", body, err, want)
		}
	}
}

func TestQuery(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/x?wait=true&timeout=2s&ip=10.0.0.1&ip=::ffff:10.0.0.2&bad=maybe", nil)
	if b, err := QueryBool(r, "wait", false); !b || err != nil {
		t.Errorf("wait: %v %v", b, err)
	}
	if b, err := QueryBool(r, "follow", true); !b || err != nil {
		t.Errorf("follow (absent): %v %v", b, err)
	}
	if _, err := QueryBool(r, "bad", false); err == nil || err.Error() != `invalid request: bad="maybe": want true or false` {
		t.Errorf("bad: %v", err)
	}
	if d, err := QueryDuration(r, "timeout", time.Second, time.Minute); d != 2*time.Second || err != nil {
		t.Errorf("timeout: %v %v", d, err)
	}
	if _, err := QueryDuration(r, "timeout", time.Second, time.Second); err == nil || err.Error() != `invalid request: timeout="2s": want a duration up to 1s` {
		t.Errorf("timeout over max: %v", err)
	}
	ips, err := QueryAddrs(r, "ip")
	if err != nil || len(ips) != 2 || ips[1] != netip.MustParseAddr("10.0.0.2") {
		t.Errorf("ip: %v %v", ips, err)
	}
	if _, err := QueryAddrs(r, "bad"); err == nil || err.Error() != `invalid request: bad="maybe" is not an IP address` {
		t.Errorf("bad ip: %v", err)
	}
}

// serve serves handler on a unix socket, as the agent's API.
func serve(t *testing.T, handler http.Handler) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return socket
}

func TestClient(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		var v struct {
			N int `json:"n"`
		}
		if err := DecodeBody(r, 1<<10, &v, `{"n": 1}`); err != nil {
			WriteError(w, http.StatusBadRequest, "invalid-request", err)
			return
		}
		WriteJSON(w, http.StatusCreated, v)
	})
	mux.HandleFunc("GET /lines", func(w http.ResponseWriter, r *http.Request) {
		s := NewStream(w)
		for i := range 3 {
			s.Encode(i)
		}
		s.Flush()
	})
	c := NewClient(serve(t, mux), 5*time.Second)

	var out struct{ N int }
	if code, err := c.Do(http.MethodPost, "/echo", map[string]int{"n": 7}, &out); code != 201 || err != nil || out.N != 7 {
		t.Errorf("Do: %d %v %+v", code, err, out)
	}
	code, err := c.Do(http.MethodPost, "/echo", map[string]int{"m": 7}, nil)
	var ae *APIError
	if !errors.As(err, &ae) || code != 400 || ae.Body.Reason != "invalid-request" || !strings.Contains(string(ae.Answer), `"reason":"invalid-request"`) {
		t.Errorf("Do, a bad body: %d %v", code, err)
	}
	if code, err := c.Do(http.MethodGet, "/nosuch", nil, nil); code != 404 || err == nil || errors.As(err, &ae) {
		t.Errorf("Do, no endpoint: %d %v", code, err)
	}
	if code, body, err := c.Send(http.MethodPost, "/echo", map[string]int{"m": 7}); code != 400 || err != nil || !strings.Contains(string(body), "m") {
		t.Errorf("Send: %d %v %s", code, err, body)
	}

	var lines []string
	code, err = c.Stream(context.Background(), "/lines", func(line []byte) error {
		lines = append(lines, string(line))
		return nil
	})
	if code != 200 || err != nil || strings.Join(lines, ",") != "0,1,2" {
		t.Errorf("Stream: %d %v %q", code, err, lines)
	}
	if code, err := c.Stream(context.Background(), "/nosuch", func([]byte) error { return nil }); code != 404 || err == nil {
		t.Errorf("Stream, no endpoint: %d %v", code, err)
	}

	gone := NewClient(filepath.Join(t.TempDir(), "none.sock"), time.Second)
	if _, err := gone.Do(http.MethodGet, "/", nil, nil); !errors.As(err, new(*NotRunningError)) {
		t.Errorf("no agent: %v", err)
	}
	if _, err := gone.Stream(context.Background(), "/", func([]byte) error { return nil }); !errors.As(err, new(*NotRunningError)) {
		t.Errorf("no agent, streaming: %v", err)
	}
}
