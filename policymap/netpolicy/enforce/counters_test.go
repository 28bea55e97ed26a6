package enforce

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
)

// verdictsText is the exposition of enimasq_policy_verdicts_total with
// the given counts (by policybpf.VerdictCounterIndex), every series present.
func verdictsText(counts map[uint32]uint64) string {
	var b strings.Builder
	b.WriteString("# HELP enimasq_policy_verdicts_total Decisions of the network-policy programs on the pods' devices by direction (ingress, egress), verdict (allow, deny, " +
		"audit: denied by the policy and passed by --policy-audit-mode) and the tier that decided (admin, namespace, baseline, default); packets of an allowed connection and drops before the policy are not counted\n")
	b.WriteString("# TYPE enimasq_policy_verdicts_total counter\n")
	for _, dir := range []string{"egress", "ingress"} {
		for _, tier := range []policybpf.PolicyStep{policybpf.StepAdmin, policybpf.StepBaseline, policybpf.StepDefault, policybpf.StepNamespace} {
			for _, verdict := range []string{"allow", "audit", "deny"} {
				i := policybpf.VerdictCounterIndex(dir == "egress", verdict == "deny", tier)
				if verdict == "audit" {
					i = policybpf.AuditCounterIndex(dir == "egress", tier)
				}
				fmt.Fprintf(&b, "enimasq_policy_verdicts_total{direction=%q,tier=%q,verdict=%q} %d\n", dir, tier, verdict, counts[i])
			}
		}
	}
	return b.String()
}

// The mode is a metric: enimasq_policy_enforcement_info{mode, audit} 1.
func TestPolicyEnforcementInfo(t *testing.T) {
	for _, tc := range []struct {
		s    Settings
		want string
	}{
		{Settings{Mode: policybpf.PolicyModeStandard}, `audit="false",mode="standard"`},
		{Settings{Mode: policybpf.PolicyModeStrict, Audit: true, Events: true}, `audit="true",mode="strict"`},
	} {
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(newVerdictCounters(tc.s).info)
		want := "# HELP enimasq_policy_enforcement_info The mode of the network-policy programs: mode (standard, strict) and audit " +
			"(true: a packet the policy denies passes, --policy-audit-mode); always 1\n" +
			"# TYPE enimasq_policy_enforcement_info gauge\n" +
			"enimasq_policy_enforcement_info{" + tc.want + "} 1\n"
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
			t.Errorf("%+v: %v", tc.s, err)
		}
	}
}

func TestVerdictCounters(t *testing.T) {
	if outs := newVerdictCounters(Settings{Off: "network policy is disabled"}).collectors(); len(outs.Collectors) != 0 {
		t.Errorf("enforcement off: %d collectors, want none", len(outs.Collectors))
	}
	c := newVerdictCounters(Settings{})
	if outs := c.collectors(); len(outs.Collectors) != 2 {
		t.Fatalf("enforcement on: %d collectors, want the counters and the mode", len(outs.Collectors))
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	// Before the state maps are there: no series (not a reset to 0).
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Errorf("before the state: %d series, %v", n, err)
	}
	var counts [policybpf.PolicyVerdictCounters]uint64
	var readErr error
	c.read = func() ([policybpf.PolicyVerdictCounters]uint64, error) { return counts, readErr }
	if err := testutil.GatherAndCompare(reg, strings.NewReader(verdictsText(nil))); err != nil {
		t.Errorf("every series at 0: %v", err)
	}
	want := map[uint32]uint64{
		policybpf.VerdictCounterIndex(true, false, policybpf.StepNamespace): 12,
		policybpf.VerdictCounterIndex(true, true, policybpf.StepAdmin):      3,
		policybpf.VerdictCounterIndex(false, true, policybpf.StepDefault):   5,
		policybpf.VerdictCounterIndex(false, false, policybpf.StepBaseline): 1 << 40,
		policybpf.AuditCounterIndex(true, policybpf.StepNamespace):          7,
	}
	for i, n := range want {
		counts[i] = n
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(verdictsText(want))); err != nil {
		t.Error(err)
	}
	readErr = errors.New("map closed")
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Errorf("unreadable: %d series, %v", n, err)
	}
}

// TestPrivilegedVerdictCounters reads the programs' pinned per-CPU
// counters: each decision of the program on the pinned state counts once.
func TestPrivilegedVerdictCounters(t *testing.T) {
	celltest.RequireRoot(t)
	progs, s := privilegedPrograms(t, Settings{Mode: policybpf.PolicyModeStandard})
	c := newVerdictCounters(s)
	c.readFrom(progs.stateMap)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(verdictsText(nil))); err != nil {
		t.Errorf("a fresh map: %v", err)
	}
	prog, err := progs.get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	frame, _ := policybpf.PolicyTestFrame(netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.1.2.3"), uint8(policybpf.ProtocolUDP), 40000, 53)
	for range 5 {
		if res, err := prog.Run(policybpf.Egress, frame); err != nil || !res.Allow || res.Step != policybpf.StepDefault {
			t.Fatalf("%+v %v", res, err)
		}
	}
	back, _ := policybpf.PolicyTestFrame(netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("10.0.0.5"), uint8(policybpf.ProtocolTCP), 40000, 80)
	if res, err := prog.Run(policybpf.Ingress, back); err != nil || !res.Allow {
		t.Fatalf("%+v %v", res, err)
	}
	want := map[uint32]uint64{
		policybpf.VerdictCounterIndex(true, false, policybpf.StepDefault):  5,
		policybpf.VerdictCounterIndex(false, false, policybpf.StepDefault): 1,
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(verdictsText(want))); err != nil {
		t.Error(err)
	}
}
