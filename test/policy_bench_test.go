package test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/enimasq/enimasq/cells/celltest"
)

// manyPodsPolicyEndpoint is the 3.8 MB file: one PolicyEndpoint
// selecting pods pods (100.64.0.0 + i, on node 100.127.0.1), isolated both
// ways, with one rule each way. Each pod gets six entries: the root, the
// rule and the node, per direction.
func manyPodsPolicyEndpoint(pods int) string {
	var b strings.Builder
	b.WriteString(`apiVersion: networking.k8s.aws/v1alpha1
kind: PolicyEndpoint
metadata:
  name: many-pods
  namespace: bench
spec:
  policyRef:
    name: many-pods
    namespace: bench
  podIsolation: [Ingress, Egress]
  ingress:
  - cidr: 100.64.0.0/10
  egress:
  - cidr: 10.0.0.0/8
    ports: [{protocol: UDP, port: 53}]
  podSelectorEndpoints:
`)
	for i := range pods {
		fmt.Fprintf(&b, "  - {hostIP: 100.127.0.1, podIP: 100.%d.%d.%d, name: pod-%d, namespace: bench}\n", 64+(i>>16), byte(i>>8), byte(i), i)
	}
	return b.String()
}

// BenchmarkProcessPolicyManyPods50000: enimasq-agent, started on an empty
// PolicyEndpoint directory, reads a PolicyEndpoint of 50,000 pods (300,000
// map entries). rss-MB is the growth of the agent's resident set from
// before the file is written to when every entry is Done (in the kernel
// maps, whose memory is the kernel's); rss-rest-MB the growth once the
// agent has returned the freed memory (it logs it); rss-peak-MB the growth
// to its highest on the way; load-ms the time from the write until every
// entry is Done. Each iteration is a new agent; the figures are the
// largest.
func BenchmarkProcessPolicyManyPods50000(b *testing.B) {
	const pods = 50000
	content := manyPodsPolicyEndpoint(pods)
	done := regexp.MustCompile(`(?m)^enimasq_reconcile_rows\{status="done",table="policy-map-entries"\} (\d+)$`)
	var rss, rest, peak, load float64
	for range b.N {
		a := NewAgent(b)
		dir := filepath.Join(a.Dir, "policyendpoints")
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		a.Args = append(a.Args, "--enable-network-policy", "--policy-endpoints-path", dir, "--policy-map-max-entries", "262144")
		a.Start()
		a.WaitHealthy()
		pid := a.cmd.Process.Pid
		doneRows := func() int {
			_, body, err := a.Get("/metrics")
			if err != nil {
				return -1
			}
			m := done.FindSubmatch(body)
			if m == nil {
				return -1
			}
			n, _ := strconv.Atoi(string(m[1]))
			return n
		}
		a.WaitFor("policy-map-entries reported", func() bool { return doneRows() == 0 })
		before := celltest.ProcMemory(b, pid, "VmRSS")
		celltest.ResetPeakRSS(b, pid)
		start := time.Now()
		WriteFileAtomic(b, filepath.Join(dir, "many-pods.yaml"), content)
		a.WaitFor("300,000 entries Done", func() bool { return doneRows() == 6*pods })
		load = max(load, float64(time.Since(start).Microseconds())/1e3)
		rss = max(rss, float64(celltest.ProcMemory(b, pid, "VmRSS")-before)/(1<<20))
		peak = max(peak, float64(celltest.ProcMemory(b, pid, "VmHWM")-before)/(1<<20))
		a.WaitFor("freed memory returned", func() bool { return strings.Contains(a.Log(), "Returned freed memory to the OS") })
		rest = max(rest, float64(celltest.ProcMemory(b, pid, "VmRSS")-before)/(1<<20))
		if out := a.MustDbg("policy", "verdict", "--pod", "100.64.195.79", "--direction", "egress",
			"--peer", "10.1.2.3", "--proto", "udp", "--port", "53"); !strings.HasPrefix(out, "ALLOW") {
			b.Fatalf("the last pod's verdict: %s", out)
		}
		a.Stop()
	}
	b.ReportMetric(rss, "rss-MB")
	b.ReportMetric(peak, "rss-peak-MB")
	b.ReportMetric(rest, "rss-rest-MB")
	b.ReportMetric(load, "load-ms")
	b.ReportMetric(float64(len(content))/(1<<20), "file-MB")
}
