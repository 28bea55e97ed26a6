package test

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// At the default log level a start and a stop log no line per hook: the
// lifecycle's threshold (100 ms) is honoured, and shell calls log nothing
// at INFO.
func TestPrivilegedAgentLogsNoHookLinesAtInfo(t *testing.T) {
	a := NewAgent(t)
	a.Start()
	a.WaitHealthy()
	a.MustDbg("shell", "--", "db")
	a.MustDbg("shell", "--", "health")
	if _, err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	log := a.Log()
	for _, noisy := range []string{"Start hook executed", "Stop hook executed", "Invoked", "Job started", "Job stopped", "Client connected"} {
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, noisy) && strings.Contains(line, "level=INFO") {
				t.Errorf("INFO line %q at the default level: %s", noisy, line)
				break
			}
		}
	}
	if !strings.Contains(log, `msg="Stopped hive"`) {
		t.Errorf("no \"Stopped hive\" line:\n%s", log)
	}
}

// --log-format=json logs one JSON object a line.
func TestPrivilegedAgentLogsJSON(t *testing.T) {
	a := NewAgent(t, "--log-format", "json")
	a.Start()
	a.WaitHealthy()
	if _, err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(a.Log()), "\n")
	obj := regexp.MustCompile(`^\{"time":"[^"]+","level":"[A-Z]+","msg":".*\}$`)
	for _, line := range lines {
		if !obj.MatchString(line) {
			t.Errorf("not a JSON log line: %s", line)
		}
	}
}

// With the API server gone, SIGTERM stops the agent cleanly (exit 0, no
// failed stop hook) within 5 s, and client-go's retries log each distinct
// error once, as a bad file is.
func TestPrivilegedAgentStopsCleanlyDuringAPIServerOutage(t *testing.T) {
	c, a := k8sPolicyAgent(t)

	c.StopAPIServer(t)
	a.WaitFor("API server outage in health", func() bool {
		_, body, _ := a.Get("/healthz")
		return strings.Contains(string(body), "unreachable")
	})
	// Long enough for the informers to retry several times (their backoff
	// starts at 800 ms).
	time.Sleep(6 * time.Second)

	took, err := a.Stop()
	if err != nil {
		t.Fatalf("exit after SIGTERM: %v (after %s)\n%s", err, took, a.Log())
	}
	if took > 5*time.Second {
		t.Errorf("stop took %s, want at most 5s", took)
	}
	log := a.Log()
	for _, bad := range []string{"Stop hook failed", "Failed to stop hive", "context deadline exceeded"} {
		if strings.Contains(log, bad) {
			t.Errorf("log has %q:\n%s", bad, log)
		}
	}
	// Each error of the outage (the sources', client-go's) at ERROR once,
	// however often the informers retried: the repeats go to DEBUG.
	seen := map[string]int{}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "level=ERROR") {
			_, rest, _ := strings.Cut(line, " level=")
			seen[rest]++
		}
	}
	for line, n := range seen {
		if n > 1 {
			t.Errorf("error logged %d times: %s", n, line)
		}
	}
	if len(seen) == 0 {
		t.Errorf("the outage logged no error:\n%s", log)
	}
}
