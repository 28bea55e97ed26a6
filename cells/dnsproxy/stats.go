package dnsproxy

import "sync/atomic"

// Reason says why a query got SERVFAIL or was dropped.
type Reason string

// Why a query got SERVFAIL.
const (
	// ReasonOverload: MaxInFlight queries were being served already.
	ReasonOverload Reason = "overload"
	// ReasonUpstream: the resolver did not answer in time, or could not
	// be reached.
	ReasonUpstream Reason = "upstream"
	// ReasonAnswer: the resolver's answer did not parse, or did not answer
	// the question asked.
	ReasonAnswer Reason = "answer"
	// ReasonHook: the hook returned an error.
	ReasonHook Reason = "hook"
)

// Why a request or an answer was dropped (no answer at all).
const (
	// ReasonMalformed: the request is not a DNS query.
	ReasonMalformed Reason = "malformed"
	// ReasonOversize: the request is larger than a query may be.
	ReasonOversize Reason = "oversize"
	// ReasonOrigDst: the kernel did not say where the datagram was going,
	// or it was not going to a DNS port (port 53) but to the proxy's.
	ReasonOrigDst Reason = "origdst"
	// ReasonConnLimit: MaxInFlight TCP connections were open already.
	ReasonConnLimit Reason = "conn-limit"
	// ReasonSend: the answer could not be sent to the pod.
	ReasonSend Reason = "send"
)

// Stats are the proxy's counters since New.
type Stats struct {
	// Queries are the requests read from pods, UDP and TCP.
	Queries uint64
	// Answers are the resolvers' answers given to pods (after the hook).
	Answers uint64
	// ServFail are the SERVFAIL answers given instead, by reason.
	ServFail map[Reason]uint64
	// Dropped are the requests that got no answer at all, by reason.
	Dropped map[Reason]uint64
}

// counters are the live counters behind Stats.
type counters struct {
	queries, answers atomic.Uint64
	servFail         map[Reason]*atomic.Uint64
	dropped          map[Reason]*atomic.Uint64
}

func newCounters() *counters {
	c := &counters{servFail: map[Reason]*atomic.Uint64{}, dropped: map[Reason]*atomic.Uint64{}}
	for _, r := range []Reason{ReasonOverload, ReasonUpstream, ReasonAnswer, ReasonHook} {
		c.servFail[r] = new(atomic.Uint64)
	}
	for _, r := range []Reason{ReasonMalformed, ReasonOversize, ReasonOrigDst, ReasonConnLimit, ReasonSend} {
		c.dropped[r] = new(atomic.Uint64)
	}
	return c
}

func (c *counters) snapshot() Stats {
	s := Stats{
		Queries:  c.queries.Load(),
		Answers:  c.answers.Load(),
		ServFail: make(map[Reason]uint64, len(c.servFail)),
		Dropped:  make(map[Reason]uint64, len(c.dropped)),
	}
	for r, n := range c.servFail {
		s.ServFail[r] = n.Load()
	}
	for r, n := range c.dropped {
		s.Dropped[r] = n.Load()
	}
	return s
}
