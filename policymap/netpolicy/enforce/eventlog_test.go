package enforce

import (
	"context"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/celltest"
)

var summaryLine = regexp.MustCompile(`msg="(\d+) more denied packets of pod (\S+), reason \\"([^"\\]+)\\", not logged in the last ([^ ]+) `)

// logCounts are the lines of the log by (pod, reason): the packets logged
// and the sum of the summaries' counts.
func logCounts(t *testing.T, log string) (logged, suppressed map[string]int, summaries int) {
	t.Helper()
	logged, suppressed = map[string]int{}, map[string]int{}
	pod := regexp.MustCompile(` pod=(\S+) `)
	reason := regexp.MustCompile(` reason="([^"]+)"`)
	for _, line := range strings.Split(log, "\n") {
		switch {
		case strings.Contains(line, `msg="Policy denied"`):
			logged[pod.FindStringSubmatch(line)[1]+"/"+reason.FindStringSubmatch(line)[1]]++
		case summaryLine.MatchString(line):
			m := summaryLine.FindStringSubmatch(line)
			n, _ := strconv.Atoi(m[1])
			suppressed[m[2]+"/"+m[3]] += n
			summaries++
		}
	}
	return logged, suppressed, summaries
}

// A flood of denied packets (12 s of them, 6 pods and reasons) writes a
// few lines a second per pod and reason, and summaries whose counts with
// the lines logged are every packet exactly; every event is kept and
// served all the same.
func TestEventsLogRateLimited(t *testing.T) {
	env := newEventsEnv(t, eventsOn, nil)
	e := env.events
	clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e.now = func() time.Time { return clock }
	_, sub := e.subscribe()
	var got int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ev := range sub.ch {
			got += 1 + int(ev.Missed)
		}
	}()
	type key struct {
		pod    string
		reason policybpf.PolicyReason
	}
	keys := []key{
		{"10.0.0.5", policybpf.PolicyDenied}, {"10.0.0.5", policybpf.PolicyStrict}, {"10.0.0.6", policybpf.PolicyDenied},
		{"10.0.0.7", policybpf.PolicyAdminDeny}, {"2001:db8::5", policybpf.PolicyDenied}, {"10.0.0.8", policybpf.PolicyDenied},
	}
	raw := map[key][]byte{}
	for _, k := range keys {
		peer := "10.1.2.3"
		if strings.Contains(k.pod, ":") {
			peer = "2001:db8::9"
		}
		raw[k] = testEvent(t, policybpf.Egress, k.pod, peer, 6, 80, policybpf.StepNamespace, k.reason, 0, 42)
	}
	const seconds, perSecond = 12, 20_000 // 240,000 packets
	sent := map[string]int{}
	for i := range seconds * perSecond {
		clock = clock.Add(time.Second / perSecond)
		k := keys[i%len(keys)]
		if k.pod == "10.0.0.8" && i > perSecond {
			continue // a pod that stops after a second
		}
		if err := e.handle(raw[k]); err != nil {
			t.Fatal(err)
		}
		sent[k.pod+"/"+k.reason.String()]++
		if i%(perSecond*5) == 0 {
			e.flushLog() // the reader's periodic flush
		}
	}
	e.flushLog() // at stop
	logged, suppressed, summaries := logCounts(t, env.log.String())
	total, lines := 0, 0
	for k, n := range sent {
		total += n
		lines += logged[k]
		if logged[k]+suppressed[k] != n {
			t.Errorf("%s: %d packets, %d logged + %d in summaries", k, n, logged[k], suppressed[k])
		}
		if max := eventLogBurst + int(eventLogRate*seconds) + 1; logged[k] > max {
			t.Errorf("%s: %d lines logged in %d s, want at most %d", k, logged[k], seconds, max)
		}
		if logged[k] < eventLogBurst {
			t.Errorf("%s: %d lines logged, want the first %d at least", k, logged[k], eventLogBurst)
		}
	}
	t.Logf("%d packets: %d lines, %d summaries", total, lines, summaries)
	if lines+summaries > len(keys)*(eventLogBurst+int(eventLogRate*seconds)+seconds/int(eventLogFlush.Seconds())+2) {
		t.Errorf("%d lines for %d packets", lines+summaries, total)
	}
	if !strings.Contains(env.log.String(), `suppressed=`) || !strings.Contains(env.log.String(), `interval=`) {
		t.Errorf("the summaries carry no fields:\n%s", env.log.String()[:2000])
	}
	e.unsubscribe(sub)
	close(sub.ch)
	wg.Wait()
	// A client learns what it missed with the next event it gets; those
	// missed after the last one (a slow reader at the end of the flood)
	// are the subscriber's count, with no next event to carry it.
	got += int(sub.missed)
	if got != total {
		t.Errorf("%d events served, want every one of %d", got, total)
	}
	if kept := e.Kept(); len(kept) != EventsKept {
		t.Errorf("%d events kept, want %d", len(kept), EventsKept)
	}
}

// The keys are bounded: past eventLogKeys pods, the least recently seen
// key goes, its count not lost (a summary when it goes).
func TestEventsLogLimiterKeysBounded(t *testing.T) {
	l := newEventLogLimiter(1, 1, 4)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var summaries []suppressedLine
	total := 0
	for i := range 100 {
		pod := netip.AddrFrom4([4]byte{10, 0, 0, byte(i % 10)})
		ok, s := l.allow(eventLogKey{pod: pod, reason: policybpf.PolicyDenied}, now)
		summaries = append(summaries, s...)
		if !ok {
			total++
		}
	}
	if len(l.buckets) > 4 || l.lru.Len() > 4 {
		t.Errorf("%d keys, want at most 4", len(l.buckets))
	}
	summaries = append(summaries, l.flush()...)
	n := 0
	for _, s := range summaries {
		n += int(s.n)
	}
	if n != total {
		t.Errorf("summaries count %d packets, %d were not logged", n, total)
	}
}

// TestPrivilegedEventsFloodLogLimited floods the real ring buffer: the
// program denies thousands of packets of one pod, the verdict counters
// count each, every event read is served, and the log holds a few lines
// and a summary whose count is exactly the rest of the events read.
func TestPrivilegedEventsFloodLogLimited(t *testing.T) {
	celltest.RequireRoot(t)
	progs, s := privilegedPrograms(t, Settings{Mode: policybpf.PolicyModeStrict, Events: true})
	env := newEventsEnv(t, s, nil)
	e := env.events
	e.started = true
	_, sub := e.subscribe()
	var mu sync.Mutex
	read := 0
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for ev := range sub.ch {
			mu.Lock()
			read += 1 + int(ev.Missed)
			mu.Unlock()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	health := &testHealth{}
	stopped := make(chan error, 1)
	go func() { stopped <- e.run(ctx, health, progs.stateMap) }()
	stop := sync.OnceValue(func() error { cancel(); return <-stopped })
	t.Cleanup(func() { stop() })
	waitFor(t, "the reader", func() bool { return strings.HasPrefix(health.status(), "OK") })
	prog, err := progs.get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const flood = 20_000
	frame, _ := policybpf.PolicyTestFrame(netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.1.2.3"), uint8(policybpf.ProtocolTCP), 40000, 8443)
	for i := range flood {
		if res, err := prog.Run(policybpf.Egress, frame); err != nil || res.Allow {
			t.Fatalf("packet %d: %+v %v", i, res, err)
		}
	}
	vm, err := progs.stateMap(policybpf.PolicyVerdictsMapName)
	if err != nil {
		t.Fatal(err)
	}
	counters, err := policybpf.ReadPolicyVerdicts(vm)
	if err != nil {
		t.Fatal(err)
	}
	if n := counters[policybpf.VerdictCounterIndex(true, true, policybpf.StepDefault)]; n != flood {
		t.Errorf("egress deny default counter %d, want %d", n, flood)
	}
	// Everything the ring buffer held is read (it drops the newest
	// reports when full, never the verdicts).
	var last int
	for {
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		n := read
		mu.Unlock()
		if n == last && n > 0 {
			break
		}
		last = n
	}
	if err := stop(); err != nil { // flushes the summaries
		t.Fatal(err)
	}
	// Every event handled was served or counted as missed; those missed
	// after the last one served are the subscriber's count.
	e.unsubscribe(sub)
	close(sub.ch)
	<-drained
	last = read + int(sub.missed)
	logged, suppressed, _ := logCounts(t, env.log.String())
	k := "10.0.0.5/" + policybpf.PolicyStrict.String()
	t.Logf("%d denied, %d events read, %d lines logged, %d in summaries", flood, last, logged[k], suppressed[k])
	if logged[k] > eventLogBurst+20 || logged[k] < 1 {
		t.Errorf("%d lines logged for %d events", logged[k], last)
	}
	if logged[k]+suppressed[k] != last {
		t.Errorf("%d logged + %d in summaries, want the %d events read", logged[k], suppressed[k], last)
	}
	if last < 1000 {
		t.Errorf("only %d events read of %d", last, flood)
	}
}
