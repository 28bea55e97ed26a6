package dnsproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// udpQuery is a query a pod sent over UDP.
type udpQuery struct {
	pod      netip.AddrPort
	resolver netip.AddrPort // the original destination
	raw      []byte
	req      *dns.Msg
}

// serveUDP reads the datagrams TPROXY delivers to the family's UDP socket
// until it is closed, and serves each query on a goroutine of its own (one
// of MaxInFlight).
func (p *Proxy) serveUDP(ctx context.Context, s *sockets) {
	buf := make([]byte, maxRequest+1)
	oob := make([]byte, oobSize)
	for {
		n, oobn, flags, from, err := s.udp.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return
			}
			p.log.Warn("DNS proxy: UDP read", "error", err)
			time.Sleep(10 * time.Millisecond) // an error that repeats does not spin
			continue
		}
		p.stats.queries.Add(1)
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		if n > maxRequest || flags&unix.MSG_TRUNC != 0 {
			p.drop(ReasonOversize, "pod", from, "proto", "udp")
			continue
		}
		dst, err := origDst(oob[:oobn])
		if err == nil && dst.Port() != dnsPort {
			// Not redirected DNS: a datagram sent to the proxy's port
			// itself. Served, it would be forwarded to the proxy again.
			err = fmt.Errorf("sent to %s, not to a DNS port", dst)
		}
		if err != nil {
			p.drop(ReasonOrigDst, "pod", from, "error", err)
			continue
		}
		req := new(dns.Msg)
		if err := req.Unpack(buf[:n]); err != nil || req.Response {
			p.drop(ReasonMalformed, "pod", from, "resolver", dst, "proto", "udp", "error", err)
			continue
		}
		q := udpQuery{pod: from, resolver: dst, raw: bytes.Clone(buf[:n]), req: req}
		if !p.acquire(from.Addr()) {
			p.servFailUDP(s, q, &failure{ReasonOverload, errOverload})
			continue
		}
		p.handlers.Go(func() {
			defer p.release(from.Addr())
			p.handleUDP(ctx, s, q)
		})
	}
}

var errOverload = errors.New("too many queries in flight")

// handleUDP asks the resolver, hands the answer to the hook, and gives it
// to the pod from the resolver's address, or SERVFAIL.
func (p *Proxy) handleUDP(ctx context.Context, s *sockets, q udpQuery) {
	a, err := p.exchangeUDP(ctx, q.resolver, q.raw, q.req)
	if err == nil {
		err = p.runHook(ctx, Query{
			Pod: q.pod.Addr(), PodPort: q.pod.Port(), Resolver: q.resolver,
			Proto: "udp", Request: q.req, Answer: a.msg,
		})
		if err != nil {
			p.putBuf(a)
		}
	}
	if err != nil {
		p.servFailUDP(s, q, err)
		return
	}
	defer p.putBuf(a)
	if err := s.reply.send((*a.buf)[answerOffset-udpHeaderLen:answerOffset+a.n], q.resolver, q.pod); err != nil {
		p.drop(ReasonSend, "pod", q.pod, "resolver", q.resolver, "error", err)
		return
	}
	p.stats.answers.Add(1)
}

// servFailUDP answers the query SERVFAIL (from the resolver's address).
func (p *Proxy) servFailUDP(s *sockets, q udpQuery, why error) {
	p.failed(why, "pod", q.pod, "resolver", q.resolver, "proto", "udp")
	b, err := servFail(q.req)
	if err == nil {
		pkt := make([]byte, udpHeaderLen+len(b))
		copy(pkt[udpHeaderLen:], b)
		err = s.reply.send(pkt, q.resolver, q.pod)
	}
	if err != nil {
		p.drop(ReasonSend, "pod", q.pod, "resolver", q.resolver, "error", err)
	}
}
