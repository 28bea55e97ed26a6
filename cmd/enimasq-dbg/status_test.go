package main

import (
	"bytes"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// statusMetrics is what an agent with a policy map and its chunk map
// serves.
const statusMetrics = `# TYPE enimasq_bpf_map_entries gauge
enimasq_bpf_map_entries{map="enimasq_egress_v4",table="policy-map-entries"} 3
enimasq_bpf_map_entries{map="enimasq_policy_chunks",table="policy-map-entries"} 1
# TYPE enimasq_bpf_map_pressure gauge
enimasq_bpf_map_pressure{map="enimasq_egress_v4",table="policy-map-entries"} 0.1875
enimasq_bpf_map_pressure{map="enimasq_policy_chunks",table="policy-map-entries"} 0.0625
# TYPE enimasq_bpf_map_capacity gauge
enimasq_bpf_map_capacity{map="enimasq_egress_v4",table="policy-map-entries"} 16
enimasq_bpf_map_capacity{map="enimasq_policy_chunks",table="policy-map-entries"} 16
`

// status shows each map's entries/max entries and percent on a line of
// its own, after the Maps lines, which stay as they were.
func TestStatusShowsMapCapacity(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"ok":true,"modules":[{"module":"policymap","level":"OK"}]}`))
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(statusMetrics)) })
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	rep, err := agentStatus(&options{apiSocket: sock}, false)
	if err != nil {
		t.Fatal(err)
	}
	if u := rep.Maps["enimasq_egress_v4"]; u.Entries != 3 || u.MaxEntries != 16 || u.Pressure != 0.1875 {
		t.Errorf("enimasq_egress_v4: %+v, want 3 of 16", u)
	}
	var out bytes.Buffer
	writeStatus(&out, rep)
	text := out.String()
	for _, re := range []string{
		`(?m)^Maps:\s+entries\s+pressure$`,
		`(?m)^  enimasq_egress_v4\s+3\s+18\.75%$`,
		`(?m)^  enimasq_policy_chunks\s+1\s+6\.25%$`,
		`(?m)^Map capacity:\s+entries/max\s+used$`,
		`(?m)^  enimasq_egress_v4\s+3/16\s+18\.75%$`,
		`(?m)^  enimasq_policy_chunks\s+1/16\s+6\.25%$`,
	} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("status does not match %q:\n%s", re, text)
		}
	}
	if strings.Index(text, "Map capacity:") < strings.Index(text, "Maps:") {
		t.Errorf("Map capacity before Maps:\n%s", text)
	}
}
