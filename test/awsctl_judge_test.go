package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"time"

	"github.com/enimasq/enimasq/cells/agentapi"
)

// awsVerdictSettle is the requirement: after the controller's last write,
// enimasq's verdicts equal the reference within this long.
const awsVerdictSettle = time.Second

// awsVerdictGrace is how much longer the verdicts are polled after the
// requirement's second has passed, to tell a late agent from a wrong one.
const awsVerdictGrace = 4 * time.Second

// awsGot is enimasq's verdict for one query (enimasq-dbg -o json).
type awsGot struct {
	Query   string `json:"query"`
	Verdict string `json:"verdict"`
	Step    string `json:"step"`
	Object  string `json:"object"`
	Reason  string `json:"reason"`
	Error   string `json:"error"`
}

func (g awsGot) String() string {
	if g.Error != "" {
		return "ERROR " + g.Error
	}
	s := g.Verdict + " " + g.Step
	if g.Object != "" {
		s += " " + g.Object
	}
	return s
}

// verdicts asks `enimasq-dbg policy verdict --stdin -o json` for every
// query in one call: the verdict, the deciding step and object.
func (e *awsEnv) verdicts(qs []awsQuery) ([]awsGot, error) {
	var in strings.Builder
	for _, q := range qs {
		fmt.Fprintf(&in, "%s %s %s %s %d\n", q.Dir, e.world.pod(q.Pod).IP, q.Peer, q.Proto, q.Port)
	}
	cmd := exec.Command(Build(e.t).Dbg, "--state-dir", e.agent.StateDir, "policy", "verdict", "--stdin", "-o", "json")
	cmd.Stdin = strings.NewReader(in.String())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var got []awsGot
	if err := json.Unmarshal(out, &got); err != nil {
		return nil, fmt.Errorf("enimasq-dbg policy verdict --stdin: %v (%v)\n%s%s", runErr, err, out, stderr.String())
	}
	if len(got) != len(qs) {
		return nil, fmt.Errorf("enimasq-dbg policy verdict --stdin: %d answers to %d queries", len(got), len(qs))
	}
	return got, nil
}

// awsRow is one case as judged: the reference, enimasq, and the packet.
type awsRow struct {
	k   awsCase
	q   awsQuery
	ref awsAnswer
	got awsGot
	// sent: a packet was tried; passed: it got its answer; want: the
	// reference for the packet's whole way (the other end's verdict too,
	// when it is a pod of this node).
	sent, passed, want bool
	why                string // the other end's verdict, when it decides the packet
}

// verdictOK: enimasq allows or denies as the reference does, at the same
// step (admin, namespace, baseline, default).
func (r *awsRow) verdictOK() bool {
	return r.got.Error == "" && (r.got.Verdict == "ALLOW") == r.ref.Allow && r.got.Step == r.ref.Step
}

// packetOK: no packet was sent, or it passed as the reference says.
func (r *awsRow) packetOK() bool { return !r.sent || r.passed == r.want }

// rows are the cases that apply to the current world (their pod is a pod
// of this node), with the reference's answers.
func (e *awsEnv) rows(cases []awsCase) []*awsRow {
	t := e.t
	t.Helper()
	var out []*awsRow
	seen := map[awsQuery]bool{}
	for _, k := range cases {
		q, err := k.query(e.names)
		if err != nil {
			t.Fatal(err)
		}
		if p := e.world.pod(q.Pod); p == nil || !p.Local || seen[q] {
			continue
		}
		seen[q] = true
		ref, err := e.world.Verdict(q)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &awsRow{k: k, q: q, ref: ref})
	}
	return out
}

// judge waits until the controller has written (more than since writes
// seen) and settled (idle twice in a row, 100 ms apart, with no write
// between), and checks that the verdicts of the program on the pods'
// devices equal the reference's within awsVerdictSettle of its last write:
// the verdicts are polled all along, and the time that counts is the start
// of the first poll of the run of agreeing polls that ends the wait. Then
// it sends the packets of the cases that packets picks (TCP and UDP, both
// ends answering), then asks `enimasq-dbg policy verdict` for every case,
// whose answers (verdict, step and object) are what the table reports.
// Every disagreement is reported in one table.
//
// The polls ask the agent's verdict API (POST /v1/policy/verdict, the
// program enimasq-dbg asks too) rather than enimasq-dbg itself: a call of
// enimasq-dbg reads the pinned maps for each query (the deciding entries),
// about a second for this many queries on a loaded two-core machine, which
// would blur a one-second requirement; a call of the API takes
// milliseconds.
func (e *awsEnv) judge(what string, cases []awsCase, since int, packets func(*awsRow) bool) []*awsRow {
	t := e.t
	t.Helper()
	rows := e.rows(cases)
	qs := make([]awsQuery, len(rows))
	for i, r := range rows {
		qs[i] = r.q
	}
	type poll struct {
		at, took time.Duration // since the start
		wrong    int           // -1: the call failed
	}
	start := time.Now()
	var polls []poll
	var written, runStart time.Time // the controller's last write; the first poll of the agreeing run
	var lastErr error
	settled, idleAt := false, -1
	controllerDeadline := start.Add(90 * time.Second)
	for {
		t0 := time.Now()
		got, err := e.agentVerdicts(qs)
		now := time.Now()
		lastErr = err
		wrong := -1
		if err == nil {
			wrong = 0
			for i, r := range rows {
				r.got = got[i]
				if !r.verdictOK() {
					wrong++
				}
			}
		}
		polls = append(polls, poll{t0.Sub(start), now.Sub(t0), wrong})
		switch {
		case wrong != 0:
			runStart = time.Time{}
		case runStart.IsZero():
			runStart = t0
		}
		if !settled {
			count, last := e.writes.snapshot()
			idle, ierr := e.controllerIdle()
			switch {
			case ierr != nil && now.After(controllerDeadline):
				t.Fatalf("%s: the controller's metrics: %v\n%s", what, ierr, e.ctl.LogTail())
			case count > since && idle && idleAt == count:
				settled, written = true, last
			case count > since && idle:
				idleAt = count
			default:
				idleAt = -1
			}
			if !settled && now.After(controllerDeadline) {
				t.Fatalf("%s: the controller did not write and settle in 90 s (%d writes, %d before; idle %t)\n%s",
					what, count, since, idle, e.ctl.LogTail())
			}
		}
		if settled && (wrong == 0 || now.After(written.Add(awsVerdictSettle+awsVerdictGrace))) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The polls around the write, for the report of a late or wrong agent:
	// when (after the last write), how long the call took, how many
	// verdicts disagreed.
	var timeline []string
	for _, p := range polls {
		if at := start.Add(p.at).Sub(written); at > -2*time.Second && len(timeline) < 40 {
			timeline = append(timeline, fmt.Sprintf("%+v(%v):%d", at.Round(time.Millisecond), p.took.Round(time.Millisecond), p.wrong))
		}
	}
	timelineText := strings.Join(timeline, " ")
	latency := runStart.Sub(written)
	switch {
	case lastErr != nil:
		t.Errorf("%s: %v", what, lastErr)
	case runStart.IsZero():
		t.Logf("%s: the verdicts never equalled the reference; polls (after the controller's last write, the call's time, disagreeing): %s", what, timelineText)
	case latency > awsVerdictSettle:
		t.Errorf("%s: the verdicts equal the reference %v after the controller's last write, want within %v; polls (the call's time, disagreeing): %s",
			what, latency.Round(time.Millisecond), awsVerdictSettle, timelineText)
	case latency <= 0:
		t.Logf("%s: %d verdicts equal the reference from before the controller's last write (%v)", what, len(rows), latency.Round(time.Millisecond))
	default:
		t.Logf("%s: %d verdicts equal the reference %v after the controller's last write", what, len(rows), latency.Round(time.Millisecond))
	}

	if packets != nil {
		e.packets(rows, packets)
	}
	// enimasq-dbg's answers, after the packets: the verdicts still hold
	// (no late write undid them), and they name the deciding objects.
	if got, err := e.verdicts(qs); err != nil {
		t.Errorf("%s: %v", what, err)
	} else {
		for i, r := range rows {
			r.got = got[i]
		}
	}
	e.report(what, rows)
	return rows
}

// agentVerdicts asks the agent's verdict API for every query: its program
// on a packet of each.
func (e *awsEnv) agentVerdicts(qs []awsQuery) ([]awsGot, error) {
	type query struct {
		Direction string `json:"direction"`
		Pod       string `json:"pod"`
		Peer      string `json:"peer"`
		Protocol  uint32 `json:"protocol"`
		Port      int32  `json:"port,omitempty"`
	}
	req := struct {
		Queries []query `json:"queries"`
	}{}
	for _, q := range qs {
		proto := map[string]uint32{"tcp": 6, "udp": 17, "sctp": 132}[q.Proto]
		req.Queries = append(req.Queries, query{Direction: q.Dir, Pod: e.world.pod(q.Pod).IP, Peer: q.Peer, Protocol: proto, Port: q.Port})
	}
	code, data, err := agentapi.NewClient(e.agent.APISocket(), 10*time.Second).Send(http.MethodPost, awsVerdictPath, req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", awsVerdictPath, err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("POST %s: %d %s\n%s", awsVerdictPath, code, http.StatusText(code), data)
	}
	var answer struct {
		Results []struct {
			Allow  bool   `json:"allow"`
			Step   string `json:"step"`
			Object string `json:"object"`
		} `json:"results"`
	}
	if err := json.Unmarshal(data, &answer); err != nil {
		return nil, fmt.Errorf("POST %s: %w\n%s", awsVerdictPath, err, data)
	}
	if len(answer.Results) != len(qs) {
		return nil, fmt.Errorf("POST %s: %d answers to %d queries", awsVerdictPath, len(answer.Results), len(qs))
	}
	out := make([]awsGot, len(qs))
	for i, r := range answer.Results {
		out[i] = awsGot{Verdict: "DENY", Step: r.Step, Object: r.Object}
		if r.Allow {
			out[i].Verdict = "ALLOW"
		}
	}
	return out, nil
}

// awsVerdictPath is the agent's verdict API (what enimasq-dbg policy
// verdict asks the running agent).
const awsVerdictPath = "/v1/policy/verdict"

// report fails the test with a table of the rows whose verdict or packet
// disagrees with the reference.
func (e *awsEnv) report(what string, rows []*awsRow) {
	t := e.t
	t.Helper()
	var bad []*awsRow
	sent, verdictBad, packetBad := 0, 0, 0
	for _, r := range rows {
		if r.sent {
			sent++
		}
		if !r.verdictOK() {
			verdictBad++
		}
		if !r.packetOK() {
			packetBad++
		}
		if !r.verdictOK() || !r.packetOK() {
			bad = append(bad, r)
		}
	}
	t.Logf("%s: %d cases, %d with packets; %d verdicts and %d packets disagree with the reference", what, len(rows), sent, verdictBad, packetBad)
	if len(bad) == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d of %d verdicts and %d of %d packets disagree with the reference:\n", what, verdictBad, len(rows), packetBad, sent)
	fmt.Fprintf(&b, "%-44s %-17s %-52s %-22s %s\n", "case", "reference", "enimasq (step object)", "packet", "the reference's reason")
	for _, r := range bad {
		pkt := "-"
		if r.sent {
			pkt = fmt.Sprintf("passed=%t want %t", r.passed, r.want)
			if !r.packetOK() {
				pkt = "✗ " + pkt
			}
		}
		enq := r.got.String()
		if !r.verdictOK() {
			enq = "✗ " + enq
		}
		why := r.ref.Why
		if r.why != "" {
			why += "; packet: " + r.why
		}
		fmt.Fprintf(&b, "%-44s %-17s %-52s %-22s %s\n", r.caseText(), r.ref, enq, pkt, why)
	}
	t.Error(b.String())
}

// caseText is the case with its peer's name and address.
func (r *awsRow) caseText() string {
	peer := r.q.Peer
	if r.k.peer != r.q.Peer {
		peer = r.k.peer + "(" + r.q.Peer + ")"
	}
	return fmt.Sprintf("%s %s %s %s/%d", r.k.pod, r.q.Dir, peer, r.q.Proto, r.q.Port)
}
