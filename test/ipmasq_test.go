package test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/policymap"
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

// pinnedPrefixes reads a pinned ipmasq map the way another program on the
// node would: opening the pin anew each time, so a replaced map is noticed.
func pinnedPrefixes(bpfRoot, name string, fam bpf.Family) ([]string, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpf.GlobalsDir(bpfRoot), name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	prefixes, err := policymap.ListPrefixes(m, fam)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(prefixes))
	for i, p := range prefixes {
		out[i] = p.String()
	}
	return out, nil
}

func TestPrivilegedIPMasqMapsAndDbgList(t *testing.T) {
	a, _ := ipMasqAgent(t, "nonMasqueradeCIDRs: [10.0.0.0/8, '2001:db8::/32']\n")
	a.WaitFor("cilium_ipmasq_v4 programmed", func() bool {
		got, err := pinnedPrefixes(a.BPFRoot, bpf.IPMasqV4MapName, bpf.IPv4)
		return err == nil && slices.Equal(got, []string{"10.0.0.0/8", "169.254.0.0/16"})
	})
	out := a.MustDbg("bpf", "ipmasq", "list") // no --bpf-root: asked of the agent, whose root is a temp dir
	for _, want := range []string{"cilium_ipmasq_v4   10.0.0.0/8", "cilium_ipmasq_v4   169.254.0.0/16"} {
		if !strings.Contains(out, want) {
			t.Errorf("bpf ipmasq list lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "2001:db8") || strings.Contains(out, "fe80") {
		t.Errorf("an IPv6 prefix is listed on an IPv4-only node:\n%s", out)
	}
	out = a.MustDbg("bpf", "ipmasq", "decide", "10.9.9.9", "8.8.8.8")
	if out != "10.9.9.9 NO_SNAT\n8.8.8.8 SNAT\n" {
		t.Errorf("bpf ipmasq decide:\n%s", out)
	}
	masq := a.MustDbg("shell", "--", "db/show", "masq-map-entries")
	if !strings.Contains(masq, "2001:db8::/32") || !strings.Contains(masq, "Skipped") {
		t.Errorf("masq-map-entries does not show the v6 CIDR as skipped:\n%s", masq)
	}
}

// A restart with pinned maps never removes an entry that is still desired,
// not even for a moment, and prunes the stale ones after start.
func TestPrivilegedRestartKeepsDesiredEntriesAndPrunesStale(t *testing.T) {
	a, path := ipMasqAgent(t, "nonMasqueradeCIDRs: [10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16]\n")
	desired := []string{"10.0.0.0/8", "169.254.0.0/16", "192.168.0.0/16"}
	a.WaitFor("maps programmed", func() bool {
		got, err := pinnedPrefixes(a.BPFRoot, bpf.IPMasqV4MapName, bpf.IPv4)
		return err == nil && len(got) == 4
	})
	if _, err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	WriteFileAtomic(t, path, "nonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16]\n")

	// Watch the pinned map through the restart.
	stop := make(chan struct{})
	type result struct {
		reads     int
		violation string
		pruned    bool
	}
	done := make(chan result)
	go func() {
		var r result
		for last := false; ; {
			select {
			case <-stop:
				if last {
					done <- r
					return
				}
				// One more read, which starts after the prune the test saw:
				// a read in flight when stop closed may predate it.
				last = true
			default:
			}
			got, err := pinnedPrefixes(a.BPFRoot, bpf.IPMasqV4MapName, bpf.IPv4)
			r.reads++
			if err != nil {
				r.violation = fmt.Sprintf("read %d: %v", r.reads, err)
				continue
			}
			for _, d := range desired {
				if !slices.Contains(got, d) && r.violation == "" {
					r.violation = fmt.Sprintf("read %d: desired %s missing: %v", r.reads, d, got)
				}
			}
			if !slices.Contains(got, "172.16.0.0/12") {
				r.pruned = true
			}
		}
	}()

	a.Start()
	a.WaitHealthy()
	a.WaitFor("stale 172.16.0.0/12 pruned", func() bool {
		got, err := pinnedPrefixes(a.BPFRoot, bpf.IPMasqV4MapName, bpf.IPv4)
		return err == nil && slices.Equal(got, desired)
	})
	close(stop)
	r := <-done
	if r.violation != "" {
		t.Errorf("during the restart: %s", r.violation)
	}
	if !r.pruned || r.reads < 10 {
		t.Errorf("monitor saw the prune: %t, in %d reads", r.pruned, r.reads)
	}
}
