package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// failure is a query the proxy answers SERVFAIL, and why.
type failure struct {
	reason Reason
	err    error
}

func (f *failure) Error() string { return string(f.reason) + ": " + f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

// reasonOf is the SERVFAIL reason of err (ReasonUpstream for an error that
// does not say).
func reasonOf(err error) Reason {
	if f, ok := errors.AsType[*failure](err); ok {
		return f.reason
	}
	return ReasonUpstream
}

// answerOffset is where an answer starts in a pooled buffer: room for the
// UDP header before it (reply.go), or for the TCP length prefix in the
// last two bytes of that room.
const answerOffset = udpHeaderLen

// answer is the resolver's answer to a query: parsed, and its bytes in a
// pooled buffer at [answerOffset:answerOffset+n], handed to the pod as
// they came.
type answer struct {
	msg *dns.Msg
	buf *[]byte
	n   int
}

// wire is the answer's bytes.
func (a answer) wire() []byte { return (*a.buf)[answerOffset : answerOffset+a.n] }

// getBuf and putBuf pool the answer buffers: MaxInFlight of them at most
// are in use.
func (p *Proxy) getBuf() *[]byte { return p.bufs.Get().(*[]byte) }
func (p *Proxy) putBuf(a answer) {
	if a.buf != nil {
		p.bufs.Put(a.buf)
	}
}

// exchangeUDP asks the resolver dst the query raw (req parsed) over UDP
// from a new socket of the node (a new source port per query, as a stub
// resolver does) and waits for its answer until the timeout. Datagrams
// with another ID are ignored (they answer nothing of this socket's); the
// first with the query's ID must answer the question.
func (p *Proxy) exchangeUDP(ctx context.Context, dst netip.AddrPort, raw []byte, req *dns.Msg) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	c, err := p.dial(ctx, "udp", dst.String())
	if err != nil {
		return answer{}, &failure{ReasonUpstream, err}
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write(raw); err != nil {
		return answer{}, &failure{ReasonUpstream, fmt.Errorf("send to %s: %w", dst, err)}
	}
	a := answer{buf: p.getBuf()}
	for {
		n, err := c.Read((*a.buf)[answerOffset:])
		if err != nil {
			p.putBuf(a)
			return answer{}, &failure{ReasonUpstream, fmt.Errorf("answer from %s: %w", dst, err)}
		}
		a.n = n
		if n < dnsHeaderLen || binary.BigEndian.Uint16(a.wire()) != req.Id {
			continue
		}
		if a.msg, err = checkAnswer(req, a.wire()); err != nil {
			p.putBuf(a)
			return answer{}, &failure{ReasonAnswer, fmt.Errorf("answer from %s: %w", dst, err)}
		}
		return a, nil
	}
}

// upstreamTCP is the connection to the resolver that serves one pod
// connection's queries, dialed at the first and again after an error.
type upstreamTCP struct {
	dst  netip.AddrPort
	conn net.Conn
}

func (u *upstreamTCP) close() {
	if u.conn != nil {
		u.conn.Close()
		u.conn = nil
	}
}

// exchangeTCP asks the resolver the query over the pod connection's
// upstream connection. A connection used before may have been closed by
// the resolver meanwhile: then the query is asked once more on a new one.
func (p *Proxy) exchangeTCP(ctx context.Context, u *upstreamTCP, raw []byte, req *dns.Msg) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	for {
		reused := u.conn != nil
		if !reused {
			c, err := p.dial(ctx, "tcp", u.dst.String())
			if err != nil {
				return answer{}, &failure{ReasonUpstream, err}
			}
			u.conn = c
		}
		a, err := p.roundTripTCP(ctx, u.conn, raw, req)
		if err == nil {
			return a, nil
		}
		u.close()
		if !reused || reasonOf(err) != ReasonUpstream || ctx.Err() != nil {
			return answer{}, err
		}
	}
}

// roundTripTCP sends the query on c and reads messages until the one
// with the query's ID.
func (p *Proxy) roundTripTCP(ctx context.Context, c net.Conn, raw []byte, req *dns.Msg) (answer, error) {
	defer context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	msg := make([]byte, 2+len(raw))
	binary.BigEndian.PutUint16(msg, uint16(len(raw)))
	copy(msg[2:], raw)
	if _, err := c.Write(msg); err != nil {
		return answer{}, &failure{ReasonUpstream, fmt.Errorf("send to %s: %w", c.RemoteAddr(), err)}
	}
	a := answer{buf: p.getBuf()}
	for {
		var prefix [2]byte
		if _, err := io.ReadFull(c, prefix[:]); err != nil {
			p.putBuf(a)
			return answer{}, &failure{ReasonUpstream, fmt.Errorf("answer from %s: %w", c.RemoteAddr(), err)}
		}
		a.n = int(binary.BigEndian.Uint16(prefix[:]))
		if _, err := io.ReadFull(c, a.wire()); err != nil {
			p.putBuf(a)
			return answer{}, &failure{ReasonUpstream, fmt.Errorf("answer from %s: %w", c.RemoteAddr(), err)}
		}
		if a.n < dnsHeaderLen || binary.BigEndian.Uint16(a.wire()) != req.Id {
			continue
		}
		var err error
		if a.msg, err = checkAnswer(req, a.wire()); err != nil {
			p.putBuf(a)
			return answer{}, &failure{ReasonAnswer, fmt.Errorf("answer from %s: %w", c.RemoteAddr(), err)}
		}
		return a, nil
	}
}

// checkAnswer parses the answer raw to req and checks that it answers it:
// a response with req's ID and the same questions (names compared without
// case). An answer with no question and no records (a bare REFUSED or
// FORMERR, as some resolvers send) carries nothing and passes. A
// truncated answer (TC) whose records do not all parse passes as it is
// (the pod asks again over TCP), with what parsed for the hook, as long
// as its questions parsed.
func checkAnswer(req *dns.Msg, raw []byte) (*dns.Msg, error) {
	ans := new(dns.Msg)
	if err := ans.Unpack(raw); err != nil {
		qdcount := 0
		if len(raw) >= dnsHeaderLen {
			qdcount = int(binary.BigEndian.Uint16(raw[4:6]))
		}
		if !ans.Truncated || len(ans.Question) != qdcount {
			return nil, fmt.Errorf("does not parse: %w", err)
		}
	}
	switch {
	case ans.Id != req.Id:
		return nil, fmt.Errorf("ID %d, asked %d", ans.Id, req.Id)
	case !ans.Response:
		return nil, errors.New("not a response")
	case !sameQuestion(req, ans):
		return nil, fmt.Errorf("answers %v, asked %v", ans.Question, req.Question)
	}
	return ans, nil
}

func sameQuestion(req, ans *dns.Msg) bool {
	if len(ans.Question) == 0 && len(ans.Answer) == 0 && len(ans.Ns) == 0 && onlyOPT(ans.Extra) {
		return true
	}
	if len(ans.Question) != len(req.Question) {
		return false
	}
	for i, q := range req.Question {
		a := ans.Question[i]
		if a.Qtype != q.Qtype || a.Qclass != q.Qclass || !strings.EqualFold(a.Name, q.Name) {
			return false
		}
	}
	return true
}

func onlyOPT(rrs []dns.RR) bool {
	for _, rr := range rrs {
		if _, ok := rr.(*dns.OPT); !ok {
			return false
		}
	}
	return true
}

// servFail is the SERVFAIL answer to req: its ID, opcode, RD and CD, and
// all its questions.
func servFail(req *dns.Msg) ([]byte, error) {
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeServerFailure)
	m.Question = req.Question
	b, err := m.Pack()
	if err != nil {
		return nil, fmt.Errorf("pack SERVFAIL: %w", err)
	}
	return b, nil
}
