package test

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/enimasq/enimasq/cells/metrics"
	"github.com/enimasq/enimasq/ipam/allocator"
)

// From the first scrape on, every documented label value of every counter
// is there at 0 (increase() sees a first failure), enimasq_build_info says
// the version, and enimasq_module_health follows a module that degrades
// and recovers. The attachment check (every second) is not a prune.
func TestPrivilegedMetricsAtZeroAndModuleHealth(t *testing.T) {
	a := NewAgent(t)
	a.HostNetwork = true // to reach --prometheus-serve-addr on the test's loopback
	addr := freeAddr(t)
	config := filepath.Join(a.Dir, "config", "ip-masq-agent")
	WriteFileAtomic(t, config, "nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	a.Args = append(a.Args, "--enable-ip-masq-agent", "--enable-bpf-masquerade", "--ip-masq-agent-config-path", config,
		"--ciliumnode-path", filepath.Join(a.Dir, "node", "ciliumnode.yaml"),
		"--enable-network-policy", "--policy-endpoints-path", filepath.Join(a.Dir, "pe"),
		"--prometheus-serve-addr", addr)
	// The policy directory exists (a missing one keeps health Degraded).
	if err := os.MkdirAll(filepath.Join(a.Dir, "pe"), 0o755); err != nil {
		t.Fatal(err)
	}
	a.Start()
	a.WaitHealthy()
	a.WaitFor("ipmasq OK in the metrics", func() bool { return scrapeMetrics(t, addr)["enimasq_module_health,level=ok,module=ipmasq"] == 1 })

	m := scrapeMetrics(t, addr)
	zero := []string{}
	for _, reason := range allocator.Reasons {
		zero = append(zero, "enimasq_ipam_allocation_failures_total,reason="+reason)
	}
	for _, r := range metrics.Reconcilers {
		zero = append(zero, "enimasq_prune_errors_total,reconciler="+r,
			"enimasq_reconcile_errors_total,reconciler="+r,
			"enimasq_reconcile_objects_in_error,reconciler="+r)
	}
	for _, outcome := range []string{"success", "fail"} {
		zero = append(zero, "enimasq_bpf_map_ops_total,map=cilium_ipmasq_v4,operation=delete,outcome="+outcome+",table=masq-map-entries")
	}
	zero = append(zero, "enimasq_bpf_map_ops_total,map=cilium_ipmasq_v4,operation=update,outcome=fail,table=masq-map-entries",
		"enimasq_bpf_map_ops_total,map=,operation=prune,outcome=fail,table=masq-map-entries",
		"enimasq_source_errors_total,source=ip-masq-agent")
	for _, key := range zero {
		if got, ok := m[key]; !ok || got != 0 {
			t.Errorf("%s = %g (present %t), want 0 from the start", key, got, ok)
		}
	}
	build := "enimasq_build_info,go_version=" + runtime.Version() + ",version="
	found := false
	for key, v := range m {
		if strings.HasPrefix(key, build) && v == 1 && len(key) > len(build) {
			found = true
		}
		if strings.HasPrefix(key, "enimasq_reconcile_errors,") {
			t.Errorf("the gauge enimasq_reconcile_errors clashes with the counter enimasq_reconcile_errors_total: %s", key)
		}
		// Every reconciler that runs is one of metrics.Reconcilers (whose
		// counters start at 0).
		if _, r, ok := strings.Cut(key, "enimasq_reconcile_duration_seconds_count,operation=update,reconciler="); ok {
			if !strings.Contains(strings.Join(metrics.Reconcilers, " "), r) {
				t.Errorf("reconciler %s is not in metrics.Reconcilers", r)
			}
		}
	}
	if !found {
		t.Errorf("no %s...} 1", build)
	}
	for _, level := range []string{"degraded", "stopped"} {
		if v, ok := m["enimasq_module_health,level="+level+",module=ipmasq"]; !ok || v != 0 {
			t.Errorf("module_health ipmasq %s = %g (present %t), want 0", level, v, ok)
		}
	}

	// The attachment check runs every second; it is not counted as a prune.
	time.Sleep(2500 * time.Millisecond)
	for _, r := range metrics.CheckReconcilers {
		if n := scrapeMetrics(t, addr)["enimasq_prune_duration_seconds_count,reconciler="+r]; n != 0 {
			t.Errorf("%s: %g prunes counted in 2.5 s of checks", r, n)
		}
	}

	// A bad file degrades ipmasq; a good one makes it OK again.
	WriteFileAtomic(t, config, "nonMasqueradeCIDRs: [10.0.0.0/33]\n")
	a.WaitFor("ipmasq degraded in the metrics", func() bool {
		m := scrapeMetrics(t, addr)
		return m["enimasq_module_health,level=degraded,module=ipmasq"] == 1 && m["enimasq_module_health,level=ok,module=ipmasq"] == 0
	})
	WriteFileAtomic(t, config, "nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	a.WaitFor("ipmasq OK again in the metrics", func() bool {
		m := scrapeMetrics(t, addr)
		return m["enimasq_module_health,level=degraded,module=ipmasq"] == 0 && m["enimasq_module_health,level=ok,module=ipmasq"] == 1
	})
}
