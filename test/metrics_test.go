package test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// freeAddr is a loopback address nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// The agent serves Prometheus metrics on --prometheus-serve-addr, in a text
// format that Prometheus' own parser reads, and enimasq-dbg status sums them
// up from the API socket.
func TestPrivilegedPrometheusMetricsAndDbgStatus(t *testing.T) {
	a := NewAgent(t)
	a.HostNetwork = true // to reach --prometheus-serve-addr on the test's loopback
	addr := freeAddr(t)
	config := filepath.Join(a.Dir, "config", "ip-masq-agent")
	WriteFileAtomic(t, config, "nonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16]\n")
	a.Args = append(a.Args, "--enable-ip-masq-agent", "--enable-bpf-masquerade", "--ip-masq-agent-config-path", config,
		"--ciliumnode-path", filepath.Join(a.Dir, "node", "ciliumnode.yaml"), "--prometheus-serve-addr", addr)
	a.Start()
	a.WaitHealthy()

	scrape := func() map[string]float64 { return scrapeMetrics(t, addr) }
	const done = "enimasq_reconcile_rows,status=done,table=masq-map-entries"
	a.WaitFor("3 masq entries Done in the metrics", func() bool { return scrape()[done] == 3 })
	m := scrape()
	for key, want := range map[string]float64{
		"enimasq_reconcile_rows,status=error,table=masq-map-entries":                                             0,
		"enimasq_bpf_map_entries,map=cilium_ipmasq_v4,table=masq-map-entries":                                    3,
		"enimasq_bpf_map_pressure,map=cilium_ipmasq_v4,table=masq-map-entries":                                   3.0 / 16384,
		"enimasq_bpf_map_capacity,map=cilium_ipmasq_v4,table=masq-map-entries":                                   16384,
		"enimasq_bpf_map_ops_total,map=cilium_ipmasq_v4,operation=update,outcome=success,table=masq-map-entries": 3,
		"enimasq_source_errors_total,source=ip-masq-agent":                                                       0,
	} {
		if got, ok := m[key]; !ok || got != want {
			t.Errorf("%s = %g (present %t), want %g", key, got, ok, want)
		}
	}
	if m["enimasq_source_last_success_timestamp_seconds,source=ip-masq-agent"] == 0 {
		t.Errorf("no last good load time for the ip-masq-agent file")
	}

	// Every enimasq_ family served is documented in Documentation/metrics.md.
	doc, err := os.ReadFile("../Documentation/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	for key := range m {
		name, _, _ := strings.Cut(key, ",")
		name = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if strings.HasPrefix(name, "enimasq_") && !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("%s is served but not in Documentation/metrics.md", name)
		}
	}

	out := a.MustDbg("status", "--verbose")
	for _, want := range []string{`Agent:\s+OK`, `ipmasq\s+OK`, `masq-map-entries\s+3\s+0\s+0\n`,
		`cilium_ipmasq_v4\s+3\s+0\.02%`, `Map capacity:\s+entries/max\s+used\n  cilium_ipmasq_v4\s+3/16384\s+0\.02%\n`, `ip-masq-agent\s+\d+s ago\s+0`, `Rows in error:\n  none`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("enimasq-dbg status does not match %q:\n%s", want, out)
		}
	}
}

// enimasq-dbg status --verbose lists the rows in error with their reason
// and exits 1: policy maps of two entries cannot hold the sample's.
func TestPrivilegedDbgStatusListsRowsInError(t *testing.T) {
	a := NewAgent(t)
	dir := filepath.Join(a.Dir, "policyendpoints")
	WriteFileAtomic(t, filepath.Join(dir, "web.yaml"), sample(t, "policyendpoint-v6-except.yaml"))
	a.Args = append(a.Args, "--enable-network-policy", "--policy-endpoints-path", dir, "--policy-map-max-entries", "2")
	a.Start()

	row := regexp.MustCompile(`\n  policy-map-entries \{"Map":"enimasq_egress_v4","Peer":"[0-9./]+","Pod":"10\.130\.100\.133","Ports":"[^"]+"(,"Version":\d+)?\}: update enimasq_egress_v4 key .*: no space left on device\n`)
	var out string
	a.WaitFor("rows in error listed", func() bool {
		var err error
		out, _, err = a.Dbg("status", "--verbose")
		var exit *exec.ExitError
		return errors.As(err, &exit) && exit.ExitCode() == 1 && row.MatchString(out)
	})
	if !strings.Contains(out, "Rows in error:\n  policy-map-entries") {
		t.Errorf("no rows in error listed:\n%s", out)
	}
	// The full map is at 100%: the two keys it took of two.
	full := regexp.MustCompile(`\n  enimasq_egress_v4\s+2/2\s+100\.00%\n`)
	a.WaitFor("enimasq_egress_v4 full in status", func() bool {
		out, _, _ = a.Dbg("status")
		return full.MatchString(out)
	})
}

// scrapeMetrics reads /metrics at addr with Prometheus' own parser: one
// value per "name,label=value,..." key (labels sorted by name); a
// histogram's count is name_count.
func scrapeMetrics(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %s", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return parseMetrics(t, body)
}

// agentMetrics reads /metrics on the agent API socket, as parseMetrics.
func agentMetrics(t *testing.T, a *Agent) map[string]float64 {
	t.Helper()
	code, body, err := a.Get("/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /metrics on the agent socket: %d %v", code, err)
	}
	return parseMetrics(t, body)
}

// parseMetrics parses an exposition as scrapeMetrics keys it.
func parseMetrics(t *testing.T, body []byte) map[string]float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("/metrics does not parse: %s\n%s", err, body)
	}
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			labels := ""
			for _, l := range m.GetLabel() {
				labels += "," + l.GetName() + "=" + l.GetValue()
			}
			switch {
			case m.Gauge != nil:
				out[name+labels] = m.GetGauge().GetValue()
			case m.Counter != nil:
				out[name+labels] = m.GetCounter().GetValue()
			case m.Histogram != nil:
				out[name+"_count"+labels] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}
