package dnsproxy

import (
	"errors"
	"time"
)

// Config is what New needs.
type Config struct {
	// Port is the proxy's port in the node's network namespace, the same
	// for UDP and TCP and both families (Redirect's port); 0 picks a free
	// one (tests).
	Port uint16
	// IPv4 and IPv6 say which families the proxy serves (at least one).
	IPv4, IPv6 bool
	// Timeout bounds how long the resolver has to answer a query, and
	// separately how long the hook has for the answer; 0 is
	// DefaultTimeout. A stub resolver retries after about 5 s (glibc), so
	// a failure is best answered before that.
	Timeout time.Duration
	// MaxInFlight bounds the queries being served at once, and on its own
	// the TCP connections open at once; past it a query is answered
	// SERVFAIL at once and a connection closed. 0 is DefaultMaxInFlight.
	MaxInFlight int
	// Mark is the fwmark of the redirect (Redirect's mark). The proxy's own
	// packets never carry it (their mark is 0): a packet with it is
	// delivered to the node's local sockets by the redirect's ip rule.
	Mark uint32
}

const (
	// DefaultTimeout is the upstream (and hook) timeout of a zero Config.
	DefaultTimeout = 2 * time.Second
	// DefaultMaxInFlight is the bound on concurrent queries of a zero
	// Config.
	DefaultMaxInFlight = 256
)

// Size limits. A DNS query is a header, its question and perhaps an OPT
// record: tens to a few hundred bytes. maxRequest bounds what a pod's
// datagram or TCP message may make the proxy read and forward; anything
// larger is not a stub resolver's query and is dropped, whatever the
// transport. Answers may be as large as DNS allows (65535 bytes, the TCP
// length prefix and the UDP datagram alike: an EDNS0 client may advertise
// up to 65535 and the resolver answer that over UDP, in IP fragments). The
// proxy passes an answer whole or not at all, so it reads answers into
// buffers of maxAnswer; MaxInFlight of them bound the memory (256 x 64 KiB
// = 16 MiB at most, pooled).
const (
	maxRequest = 4096
	maxAnswer  = 65535
	// udpHeaderLen is the room before an answer for the UDP header that
	// the raw reply socket sends (reply.go).
	udpHeaderLen = 8
	// tcpIdleTimeout closes a pod's TCP connection that sends no query
	// for this long (RFC 7766 asks for idle timeouts of seconds).
	tcpIdleTimeout = 10 * time.Second
	// dnsHeaderLen is the fixed header of every DNS message.
	dnsHeaderLen = 12
)

// withDefaults fills the zero values and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if !c.IPv4 && !c.IPv6 {
		return c, errors.New("neither IPv4 nor IPv6 enabled")
	}
	if c.Mark == 0 {
		return c, errors.New("mark 0: the redirect needs a fwmark")
	}
	if c.Timeout < 0 || c.MaxInFlight < 0 {
		return c, errors.New("negative timeout or max in flight")
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	return c, nil
}
