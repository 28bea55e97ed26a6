package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"
)

// serveTCP accepts the connections TPROXY gives the family's listener
// until it is closed, each served on a goroutine of its own (one of
// MaxInFlight: past them a connection is closed at once).
func (p *Proxy) serveTCP(ctx context.Context, s *sockets) {
	for {
		c, err := s.tcp.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return
			}
			p.log.Warn("DNS proxy: TCP accept", "error", err)
			time.Sleep(10 * time.Millisecond) // EMFILE and the like do not spin
			continue
		}
		pod := unmapped(c.RemoteAddr()).Addr()
		if !p.podConns.take(pod) {
			p.drop(ReasonConnLimit, "pod", c.RemoteAddr())
			c.Close()
			continue
		}
		select {
		case p.conns <- struct{}{}:
		default:
			p.podConns.put(pod)
			p.drop(ReasonConnLimit, "pod", c.RemoteAddr())
			c.Close()
			continue
		}
		p.handlers.Go(func() {
			defer func() { <-p.conns; p.podConns.put(pod) }()
			p.serveConn(ctx, c)
		})
	}
}

// tcpConn is a pod's TCP connection to a resolver, as TPROXY gave it: its
// local address is the resolver's.
type tcpConn struct {
	c        *net.TCPConn
	pod      netip.AddrPort
	resolver netip.AddrPort
}

// serveConn serves the queries of a pod's connection in order, one at a
// time, until the pod closes it, is idle for tcpIdleTimeout, sends what is
// not a query, or the proxy stops.
func (p *Proxy) serveConn(ctx context.Context, c *net.TCPConn) {
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.Close() })()
	tc := tcpConn{c: c, pod: unmapped(c.RemoteAddr()), resolver: unmapped(c.LocalAddr())}
	if tc.resolver.Port() != dnsPort {
		// Not redirected DNS: a connection to the proxy's port itself
		// (served, it would be forwarded to the proxy again).
		p.drop(ReasonOrigDst, "pod", tc.pod, "to", tc.resolver)
		return
	}
	up := &upstreamTCP{dst: tc.resolver}
	defer up.close()
	for {
		c.SetReadDeadline(time.Now().Add(tcpIdleTimeout))
		raw, err := readTCPMessage(c)
		if err != nil {
			if errors.Is(err, errTooLarge) {
				p.stats.queries.Add(1)
				p.drop(ReasonOversize, "pod", tc.pod, "proto", "tcp")
			}
			return
		}
		p.stats.queries.Add(1)
		req := new(dns.Msg)
		if err := req.Unpack(raw); err != nil || req.Response {
			p.drop(ReasonMalformed, "pod", tc.pod, "resolver", tc.resolver, "proto", "tcp", "error", err)
			return
		}
		if !p.acquire(tc.pod.Addr()) {
			if !p.servFailTCP(tc, req, &failure{ReasonOverload, errOverload}) {
				return
			}
			continue
		}
		ok := p.handleTCP(ctx, tc, up, raw, req)
		p.release(tc.pod.Addr())
		if !ok {
			return
		}
	}
}

// handleTCP serves one query of a pod connection: asks the resolver,
// hands the answer to the hook and writes it to the pod, or SERVFAIL. It
// says whether the connection is still good.
func (p *Proxy) handleTCP(ctx context.Context, tc tcpConn, up *upstreamTCP, raw []byte, req *dns.Msg) bool {
	a, err := p.exchangeTCP(ctx, up, raw, req)
	if err == nil {
		err = p.runHook(ctx, Query{
			Pod: tc.pod.Addr(), PodPort: tc.pod.Port(), Resolver: tc.resolver,
			Proto: "tcp", Request: req, Answer: a.msg,
		})
		if err != nil {
			p.putBuf(a)
		}
	}
	if err != nil {
		return p.servFailTCP(tc, req, err)
	}
	defer p.putBuf(a)
	// The two bytes before the answer take its length prefix.
	msg := (*a.buf)[answerOffset-2 : answerOffset+a.n]
	binary.BigEndian.PutUint16(msg, uint16(a.n))
	if err := p.writeTCP(tc, msg); err != nil {
		p.drop(ReasonSend, "pod", tc.pod, "resolver", tc.resolver, "error", err)
		return false
	}
	p.stats.answers.Add(1)
	return true
}

// servFailTCP answers the query SERVFAIL; it says whether the connection
// is still good.
func (p *Proxy) servFailTCP(tc tcpConn, req *dns.Msg, why error) bool {
	p.failed(why, "pod", tc.pod, "resolver", tc.resolver, "proto", "tcp")
	b, err := servFail(req)
	if err == nil {
		msg := make([]byte, 2+len(b))
		binary.BigEndian.PutUint16(msg, uint16(len(b)))
		copy(msg[2:], b)
		err = p.writeTCP(tc, msg)
	}
	if err != nil {
		p.drop(ReasonSend, "pod", tc.pod, "resolver", tc.resolver, "error", err)
		return false
	}
	return true
}

// writeTCP writes a length-prefixed message to the pod, within the
// Timeout.
func (p *Proxy) writeTCP(tc tcpConn, msg []byte) error {
	tc.c.SetWriteDeadline(time.Now().Add(p.cfg.Timeout))
	if _, err := tc.c.Write(msg); err != nil {
		return fmt.Errorf("write to %s: %w", tc.pod, err)
	}
	return nil
}

var errTooLarge = errors.New("query larger than a query may be")

// readTCPMessage reads one length-prefixed message of at most maxRequest
// bytes.
func readTCPMessage(r io.Reader) ([]byte, error) {
	var prefix [2]byte
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(prefix[:]))
	if n > maxRequest {
		return nil, errTooLarge
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// unmapped is the address and port of a TCP address, IPv4 as IPv4.
func unmapped(a net.Addr) netip.AddrPort {
	ap := a.(*net.TCPAddr).AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
