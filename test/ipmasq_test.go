package test

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// ipMasqAgent starts an agent reading the ip-masq-agent file at the returned
// path, which starts with content.
func ipMasqAgent(t *testing.T, content string) (*Agent, string) {
	a := NewAgent(t)
	path := filepath.Join(a.Dir, "config", "ip-masq-agent")
	WriteFileAtomic(t, path, content)
	a.Args = append(a.Args, "--enable-ip-masq-agent", "--enable-bpf-masquerade", "--ip-masq-agent-config-path", path)
	a.Start()
	a.WaitHealthy()
	return a, path
}

func (a *Agent) waitPrefixes(want ...string) {
	a.t.Helper()
	var got []string
	a.WaitFor("ip-masq-agent-cidrs = "+strings.Join(want, " "), func() bool {
		got = Column(a.Rows("ip-masq-agent-cidrs"), "Prefix")
		return slices.Equal(got, want)
	})
}

func TestPrivilegedIPMasqAgentFollowsTheFileAndKeepsRowsOnBadInput(t *testing.T) {
	sample, err := os.ReadFile("testdata/samples/ip-masq-agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a, path := ipMasqAgent(t, string(sample))
	a.waitPrefixes("10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16", "fe80::/10")

	// A peered VPC is added under the running agent.
	WriteFileAtomic(t, path, strings.Replace(string(sample), "- 10.0.0.0/8\n", "- 10.0.0.0/8\n- 100.200.0.0/16\n", 1))
	a.waitPrefixes("10.0.0.0/8", "100.64.0.0/10", "100.200.0.0/16", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16", "fe80::/10")

	// An invalid file: /healthz reports it, the rows stay.
	WriteFileAtomic(t, path, "nonMasqueradeCIDRs: [10.0.0.0/8, 100.200.0.0/61]\n")
	var body []byte
	a.WaitFor("/healthz 503", func() bool {
		var code int
		code, body, _ = a.Get("/healthz")
		return code == http.StatusServiceUnavailable
	})
	for _, want := range []string{path, "nonMasqueradeCIDRs[1]", "100.200.0.0/61", `"module": "ipmasq"`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/healthz does not mention %q:\n%s", want, body)
		}
	}
	got := Column(a.Rows("ip-masq-agent-cidrs"), "Prefix")
	if !slices.Contains(got, "100.200.0.0/16") || len(got) != 7 {
		t.Errorf("rows changed after an invalid file: %v", got)
	}
	if out, _, err := a.Dbg("health"); err == nil || !strings.Contains(out, "ipmasq") || !strings.Contains(out, "Degraded") {
		t.Errorf("enimasq-dbg health: %v\n%s", err, out)
	}

	// Fixed: healthy again.
	WriteFileAtomic(t, path, "nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqLinkLocal: true\nmasqLinkLocalIPv6: true\n")
	a.waitPrefixes("10.0.0.0/8")
	a.WaitHealthy()
}
