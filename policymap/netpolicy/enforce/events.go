package enforce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/agentapi"
)

// EventsPath is where the denied packets are served (under APIPatterns):
//
//	GET /v1/policy/events[?follow=false]
//
// answers 200 and a stream of Event, one JSON object a line
// (application/x-ndjson): the last EventsKept the programs reported, then
// each new one as it comes, until the client goes or the agent stops; with
// follow=false, the buffered ones only. The programs report denied packets
// only with --policy-event-logs. Errors are {"error", "reason"} with 400
// (invalid request), 404 (events off: reason "events-off"; enforcement off:
// "not-enforced") or 503 (the ring buffer cannot be read).
const EventsPath = "/v1/policy/events"

// EventsKept is how many of the last events the agent keeps for a client
// that comes later.
const EventsKept = 1024

// subscriberBuffer is how many events a slow client may be behind before
// it misses some (Event.Missed says how many).
const subscriberBuffer = 1024

// Event is a packet the policy programs denied, as the agent reports it.
type Event struct {
	// Time is when the agent read it from the ring buffer.
	Time time.Time `json:"time"`
	// Direction is "egress" (the pod sent it) or "ingress" (it receives
	// it).
	Direction string `json:"direction"`
	// Pod and Peer are empty for a frame that is not IP.
	Pod  netip.Addr `json:"pod"`
	Peer netip.Addr `json:"peer"`
	// Protocol is the IP protocol number; SrcPort and DstPort the
	// packet's ports (0 without ports).
	Protocol uint8  `json:"protocol"`
	SrcPort  uint16 `json:"sport"`
	DstPort  uint16 `json:"dport"`
	// Step is the step that decided: admin, namespace, baseline,
	// default, or none for a drop before the policy (spoofed, malformed,
	// an unknown fragment).
	Step string `json:"step"`
	// Object names the deciding object when the agent knows it
	// ("ClusterPolicyEndpoint/name", the PolicyEndpoints that isolate the
	// pod); ObjectID is the id the program reported (policybpf.ObjectID), 0
	// when it names none.
	Object   string `json:"object,omitempty"`
	ObjectID uint32 `json:"objectId,omitempty"`
	// Reason is policybpf.PolicyReason, as in the verdict API; ReasonText says
	// it in words.
	Reason     policybpf.PolicyReason `json:"reason"`
	ReasonText string                 `json:"reasonText"`
	// Device is the pod's host-side device (its name when the agent
	// attached to it), Ifindex its index.
	Device  string `json:"device,omitempty"`
	Ifindex uint32 `json:"ifindex"`
	// Audited: the policy denied the packet and audit mode
	// (--policy-audit-mode) passed it.
	Audited bool `json:"audited,omitempty"`
	// Missed is how many events this client missed just before this one
	// (it read too slowly).
	Missed uint64 `json:"missed,omitempty"`
}

// Events reads the events ring buffer, logs each denied packet, keeps the
// last EventsKept and hands them to the clients of EventsPath.
type Events struct {
	log      *slog.Logger
	settings Settings
	names    ObjectNames
	db       *statedb.DB
	table    statedb.Table[*Attachment]
	now      func() time.Time
	// limiter limits the log lines per pod and reason.
	limiter *eventLogLimiter

	// Devices by ifindex, from the attachments table (the reader's
	// own: no lock).
	devices     map[uint32]string
	devicesSeen <-chan struct{}

	mu      sync.Mutex
	started bool
	err     error // why the ring buffer is not read, when it is not
	kept    []Event
	next    int // where the next event goes in kept, once it is full
	subs    map[*subscriber]struct{}
	done    chan struct{} // closed when the reader stops
}

type subscriber struct {
	ch     chan Event
	missed uint64 // under Events.mu
}

type eventsParams struct {
	cell.In

	Log      *slog.Logger
	Settings Settings
	DB       *statedb.DB
	Table    statedb.Table[*Attachment]
	Names    ObjectNames `optional:"true"`
}

func newEvents(p eventsParams) *Events {
	return &Events{
		log: p.Log, settings: p.Settings, names: p.Names, db: p.DB, table: p.Table, now: time.Now,
		subs: map[*subscriber]struct{}{}, done: make(chan struct{}),
		limiter: newEventLogLimiter(eventLogRate, eventLogBurst, eventLogKeys),
	}
}

// start reads the ring buffer in a job, with events on: state returns the
// programs' state map of a name.
func (e *Events) start(jobs job.Group, state func(name string) (*ebpf.Map, error)) {
	if !e.settings.Events {
		return
	}
	e.mu.Lock()
	e.started = true
	e.mu.Unlock()
	jobs.Add(job.OneShot("policy-events", func(ctx context.Context, health cell.Health) error {
		return e.run(ctx, health, state)
	}))
}

// run reads the ring buffer until ctx ends, opening it again after a
// failure; the clients' streams end with it.
func (e *Events) run(ctx context.Context, health cell.Health, state func(name string) (*ebpf.Map, error)) error {
	defer e.stop()
	const minWait, maxWait = 100 * time.Millisecond, 30 * time.Second
	wait := minWait
	for {
		err := e.read(ctx, health, state)
		if ctx.Err() != nil {
			return nil
		}
		e.setErr(err)
		e.log.Warn("Could not read the policy events", "error", err, "retry-in", wait)
		health.Degraded("reading the policy events ring buffer", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, maxWait)
	}
}

// read opens the ring buffer and reads it until ctx ends (nil) or reading
// fails.
func (e *Events) read(ctx context.Context, health cell.Health, state func(name string) (*ebpf.Map, error)) error {
	m, err := state(policybpf.PolicyEventsMapName)
	if err != nil {
		return err
	}
	// The reader's own descriptor: the programs' state maps are closed
	// at stop, whatever the reader does then.
	if m, err = m.Clone(); err != nil {
		return fmt.Errorf("%s: %w", policybpf.PolicyEventsMapName, err)
	}
	defer m.Close()
	rd, err := ringbuf.NewReader(m)
	if err != nil {
		return fmt.Errorf("%s: %w", policybpf.PolicyEventsMapName, err)
	}
	stop := context.AfterFunc(ctx, func() { rd.Close() })
	defer stop()
	defer rd.Close()
	// The packets not logged are summed up every eventLogFlush, and when
	// the reader stops.
	flushDone := make(chan struct{})
	defer func() { close(flushDone); e.flushLog() }()
	go func() {
		t := time.NewTicker(eventLogFlush)
		defer t.Stop()
		for {
			select {
			case <-flushDone:
				return
			case <-t.C:
				e.flushLog()
			}
		}
	}()
	e.setErr(nil)
	health.OK("reading the policy events ring buffer")
	var rec ringbuf.Record
	for {
		if err := rd.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return ctx.Err()
			}
			return fmt.Errorf("read %s: %w", policybpf.PolicyEventsMapName, err)
		}
		if err := e.handle(rec.RawSample); err != nil {
			e.log.Warn("Could not decode a policy event", "error", err)
		}
	}
}

// flushLog logs the summaries of the packets not logged.
func (e *Events) flushLog() { logSuppressed(e.log, e.limiter.flush(), e.now()) }

func (e *Events) setErr(err error) {
	e.mu.Lock()
	e.err = err
	e.mu.Unlock()
}

// stop ends the clients' streams.
func (e *Events) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	select {
	case <-e.done:
	default:
		close(e.done)
	}
}

// handle logs, keeps and fans out one record of the ring buffer.
func (e *Events) handle(raw []byte) error {
	pe, err := policybpf.ParsePolicyEvent(raw)
	if err != nil {
		return err
	}
	ev := e.event(pe)
	// The log line is limited per pod and reason (eventlog.go); the event
	// is kept and served all the same.
	now := e.now()
	logged, summaries := e.limiter.allow(eventLogKey{ev.Pod, ev.Reason, ev.Audited}, now)
	logSuppressed(e.log, summaries, now)
	if logged {
		msg := "Policy denied"
		if ev.Audited {
			msg = "Policy would deny (audit mode: passed)"
		}
		e.log.Info(msg,
			"pod", ev.Pod, "peer", ev.Peer, "protocol", policybpf.ProtocolName(uint32(ev.Protocol)),
			"sport", ev.SrcPort, "dport", ev.DstPort, "direction", ev.Direction, "step", ev.Step,
			"object", objectText(ev), "reason", ev.ReasonText, "device", ev.Device)
	}
	e.publish(ev)
	return nil
}

// event is the agent's report of a program's event: the deciding object
// and the device named.
func (e *Events) event(pe policybpf.PolicyEvent) Event {
	ev := Event{
		Time: e.now(), Direction: pe.Direction.String(), Pod: pe.Pod(), Peer: pe.Peer(),
		Protocol: pe.Protocol, SrcPort: pe.SrcPort, DstPort: pe.DstPort, Step: pe.Step.String(),
		ObjectID: pe.Object, Reason: pe.Reason, ReasonText: pe.Reason.String(),
		Device: e.device(pe.Ifindex), Ifindex: pe.Ifindex, Audited: pe.Audited,
	}
	if e.names != nil && pe.Step != policybpf.StepNone {
		q := VerdictQuery{Direction: ev.Direction, Pod: ev.Pod, Peer: ev.Peer, Protocol: uint32(pe.Protocol), Port: pe.DstPort}
		res := policybpf.PolicyResult{Reason: pe.Reason, Step: pe.Step, Object: pe.Object, Interval: -1}
		ev.Object = e.names(pe.Direction, q, res)
	}
	return ev
}

// objectText is the deciding object as a log says it: its name, else its
// id, else nothing.
func objectText(ev Event) string {
	switch {
	case ev.Object != "":
		return ev.Object
	case ev.ObjectID != 0:
		return "#" + strconv.FormatUint(uint64(ev.ObjectID), 10)
	}
	return ""
}

// device names the pod device of an ifindex from the attachments table
// (read again when it changed); "" for a device the agent did not attach
// to.
func (e *Events) device(ifindex uint32) string {
	if e.table == nil || e.db == nil {
		return ""
	}
	changed := e.devicesSeen == nil
	if !changed {
		select {
		case <-e.devicesSeen:
			changed = true
		default:
		}
	}
	if changed {
		rows, watch := e.table.AllWatch(e.db.ReadTxn())
		e.devices, e.devicesSeen = map[uint32]string{}, watch
		for a := range rows {
			e.devices[uint32(a.Ifindex)] = a.Device
		}
	}
	return e.devices[ifindex]
}

// publish keeps the event and hands it to every client; a client whose
// buffer is full misses it.
func (e *Events) publish(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.kept) < EventsKept {
		e.kept = append(e.kept, ev)
	} else {
		e.kept[e.next] = ev
		e.next = (e.next + 1) % EventsKept
	}
	for s := range e.subs {
		out := ev
		out.Missed = s.missed
		select {
		case s.ch <- out:
			s.missed = 0
		default:
			s.missed++
		}
	}
}

// Kept are the events kept, oldest first.
func (e *Events) Kept() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.keptLocked()
}

func (e *Events) keptLocked() []Event {
	out := make([]Event, 0, len(e.kept))
	out = append(out, e.kept[e.next:]...)
	return append(out, e.kept[:e.next]...)
}

// subscribe returns the events kept and a subscriber that gets every
// later one (none lost in between, none twice).
func (e *Events) subscribe() ([]Event, *subscriber) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := &subscriber{ch: make(chan Event, subscriberBuffer)}
	e.subs[s] = struct{}{}
	return e.keptLocked(), s
}

func (e *Events) unsubscribe(s *subscriber) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.subs, s)
}

// errEventsOff is the answer with events off.
var errEventsOff = errors.New("the policy programs report no events: start the agent with --policy-event-logs")

// available says why the events cannot be served, if they cannot.
func (e *Events) available() (code int, reason string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.settings.Off != "":
		return http.StatusNotFound, "not-enforced", fmt.Errorf("no policy program runs (%s), so none reports events", e.settings.Off)
	case !e.settings.Events:
		return http.StatusNotFound, "events-off", errEventsOff
	case !e.started:
		return http.StatusServiceUnavailable, "not-started", errors.New("the policy events are not read yet")
	case e.err != nil && len(e.kept) == 0:
		return http.StatusServiceUnavailable, "no-ring-buffer", fmt.Errorf("the policy events ring buffer cannot be read: %w", e.err)
	}
	return http.StatusOK, "", nil
}

func (e *Events) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	follow, err := agentapi.QueryBool(r, "follow", true)
	if err != nil {
		writeError(w, err)
		return
	}
	if code, reason, err := e.available(); err != nil {
		agentapi.WriteError(w, code, reason, err)
		return
	}
	kept, sub := e.subscribe()
	defer e.unsubscribe(sub)
	stream := agentapi.NewStream(w)
	for _, ev := range kept {
		if stream.Encode(ev) != nil {
			return
		}
	}
	if stream.Flush() != nil || !follow {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-e.done:
			return
		case ev := <-sub.ch:
			if stream.Encode(ev) != nil {
				return
			}
			// What else is there goes in the same write.
			for n := len(sub.ch); n > 0; n-- {
				if stream.Encode(<-sub.ch) != nil {
					return
				}
			}
			if stream.Flush() != nil {
				return
			}
		}
	}
}
