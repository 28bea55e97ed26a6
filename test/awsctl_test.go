package test

// The AWS network policy controller v1.1.10 writes every PolicyEndpoint
// and ClusterPolicyEndpoint that enimasq-agent enforces, from real
// NetworkPolicies, ClusterNetworkPolicies, ApplicationNetworkPolicies,
// namespaces and pods on a real API server (awsctl_scenario_test.go), and
// enimasq's verdicts (`enimasq-dbg policy verdict`, the program on the
// pods' devices) and real TCP and UDP packets between pods, peers and the
// node are judged against a reference evaluator of the APIs' semantics
// written here (awsctl_reference_test.go), at --endpoint-chunk-size=200
// and at 2 (where the controller cuts each policy's pods, ingress rules
// and egress rules into slices independently). Then churn: pods come and
// go, policies and a namespace's labels are edited, a policy is deleted,
// and the controller re-slices at the other chunk size; after each change
// the verdicts must equal the reference within 1 s of the controller's
// last write, and packets agree. On the way: no object is refused (the
// tables' Error column is empty, health says nothing "invalid"), and the
// field the decoder does not know (spec.subject, which the controller
// always writes on a ClusterPolicyEndpoint) is enforced and named.
//
// One API server, one controller and one agent per chunk size; the
// verdicts of every case are polled together from the agent's verdict API
// and then taken from one enimasq-dbg call; packets run in parallel.

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestPrivilegedAWSController runs the suite at the controller's default
// chunk size (every policy of the scenario in one object) and at 2 (every
// policy with more than two pods or peer entries cut into slices); each
// run ends at the other size (the churn's re-slice).
func TestPrivilegedAWSController(t *testing.T) {
	for _, chunkSize := range []int{200, 2} {
		t.Run(fmt.Sprintf("chunk-size-%d", chunkSize), func(t *testing.T) { awsControllerSuite(t, chunkSize) })
	}
}

// awsControllerSuite sets the scenario up with the controller at
// chunkSize, judges the static cases, then each churn step.
func awsControllerSuite(t *testing.T, chunkSize int) {
	start := time.Now()
	e := newAWSEnv(t, chunkSize)
	what := fmt.Sprintf("chunk size %d, the scenario", chunkSize)
	rows := e.judge(what, awsStaticCases(), 0, awsAllPackets)
	e.checkObjects(what)
	e.checkSliced(what, chunkSize)
	t.Logf("%s: set up and judged in %v", what, time.Since(start).Round(time.Millisecond))

	before := map[awsQuery]awsAnswer{}
	for _, r := range rows {
		before[r.q] = r.ref
	}
	for i, step := range awsChurnSteps() {
		what := fmt.Sprintf("chunk size %d, churn %d (%s)", chunkSize, i+1, step.name)
		var since int
		if step.reslice {
			if chunkSize == 2 {
				chunkSize = 200
			} else {
				chunkSize = 2
			}
			what = fmt.Sprintf("churn %d, re-slice to chunk size %d", i+1, chunkSize)
			since = e.reslice(chunkSize)
		} else {
			w := e.world.clone()
			step.change(w)
			since, _ = e.writes.snapshot()
			e.sync(w)
		}
		rows := e.judge(what, append(awsStaticCases(), step.expect...), since, awsPacketSample(step.expect, before))
		e.checkObjects(what)
		if step.reslice {
			e.checkSliced(what, chunkSize)
		}
		clear(before)
		for _, r := range rows {
			before[r.q] = r.ref
		}
	}
	t.Logf("the suite took %v", time.Since(start).Round(time.Millisecond))
}

// TestAWSControllerReference checks the reference evaluator against the
// answers the scenario's author reads in the APIs, for the static cases
// and after each churn step: the privileged suites trust the reference,
// this test is what the reference is trusted on. It needs no root and no
// binaries.
func TestAWSControllerReference(t *testing.T) {
	w := awsScenario()
	names := awsNames(w)
	check := func(t *testing.T, w *awsWorld, cases []awsCase) {
		t.Helper()
		for _, k := range cases {
			q, err := k.query(names)
			if err != nil {
				t.Fatal(err)
			}
			got, err := w.Verdict(q)
			if err != nil {
				t.Errorf("%s: %v", k, err)
				continue
			}
			if got.String() != k.want {
				t.Errorf("%s: the reference says %s (%s), the author %s", k, got, got.Why, k.want)
			}
		}
	}
	cases := awsStaticCases()
	if len(cases) < 80 {
		t.Errorf("%d static cases, want at least 80", len(cases))
	}
	check(t, w, cases)
	for _, step := range awsChurnSteps() {
		if step.change != nil {
			step.change(w)
		}
		for k, v := range awsNames(w) {
			names[k] = v
		}
		t.Run(strings.ReplaceAll(step.name, " ", "_"), func(t *testing.T) { check(t, w, step.expect) })
	}
}

func (k awsCase) String() string {
	return fmt.Sprintf("%s %s %s %s/%d", k.pod, k.dir, k.peer, k.proto, k.port)
}
