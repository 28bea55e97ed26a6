package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
)

// Hook is called with each answer before the pod gets it; an error makes
// the pod get SERVFAIL instead. It runs with the Timeout; it may keep the
// messages (they are not reused).
type Hook func(ctx context.Context, q Query) error

// Query is a pod's query and the resolver's answer.
type Query struct {
	Pod      netip.Addr     // source of the query (the pod IP)
	PodPort  uint16         // its source port
	Resolver netip.AddrPort // the address the pod asked (original destination)
	Proto    string         // "udp" or "tcp"
	Request  *dns.Msg
	// Answer is the resolver's answer as the pod gets it. For a truncated
	// UDP answer (TC) it may hold only the records that parsed: the pod
	// asks again over TCP.
	Answer *dns.Msg
}

// Proxy is the transparent DNS proxy: see the package comment.
type Proxy struct {
	cfg   Config
	hook  Hook
	log   *slog.Logger
	socks []*sockets
	port  uint16

	stats    *counters
	inflight chan struct{} // a slot per query being served
	conns    chan struct{} // a slot per open pod TCP connection
	// queries and podConns are each pod's share of inflight and conns.
	queries, podConns *perPod
	bufs              sync.Pool // *[]byte of answerOffset+maxAnswer
	dialer            net.Dialer
	ns                netns.NsHandle // where upstream sockets are opened, if not here (netns.go)
	handlers          sync.WaitGroup // the goroutines of queries and connections

	ran       atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// New opens the proxy's sockets in the calling thread's network namespace
// (they stay in it): the transparent UDP and TCP sockets on cfg.Port and
// the raw sockets of the answers, for each family enabled. The sockets to
// the resolvers are opened in that namespace too. Needs
// CAP_NET_ADMIN and CAP_NET_RAW. hook may be nil.
func New(cfg Config, hook Hook, log *slog.Logger) (*Proxy, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("dns proxy: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ns, err := dialNetNS()
	if err != nil {
		return nil, fmt.Errorf("dns proxy: %w", err)
	}
	socks, port, err := openSockets(context.Background(), cfg.IPv4, cfg.IPv6, cfg.Port)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("dns proxy on port %d: %w", cfg.Port, err)
	}
	p := &Proxy{
		cfg:      cfg,
		hook:     hook,
		log:      log,
		socks:    socks,
		port:     port,
		ns:       ns,
		stats:    newCounters(),
		inflight: make(chan struct{}, cfg.MaxInFlight),
		conns:    make(chan struct{}, cfg.MaxInFlight),
		queries:  newPerPod(cfg.MaxInFlight),
		podConns: newPerPod(cfg.MaxInFlight),
		bufs: sync.Pool{New: func() any {
			b := make([]byte, answerOffset+maxAnswer)
			return &b
		}},
	}
	return p, nil
}

// Port is the proxy's port (the one picked when Config.Port was 0).
func (p *Proxy) Port() uint16 { return p.port }

// Stats are the proxy's counters.
func (p *Proxy) Stats() Stats { return p.stats.snapshot() }

// Run serves until ctx is done, then closes the sockets and returns when
// the queries being served have ended. It runs once.
func (p *Proxy) Run(ctx context.Context) error {
	if !p.ran.CompareAndSwap(false, true) {
		return errors.New("dns proxy: Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.log.Info("DNS proxy serving", "port", p.port, "ipv4", p.cfg.IPv4, "ipv6", p.cfg.IPv6)
	var loops sync.WaitGroup
	for _, s := range p.socks {
		loops.Go(func() { p.serveUDP(ctx, s) })
		loops.Go(func() { p.serveTCP(ctx, s) })
	}
	<-ctx.Done()
	// The sockets first, which ends the loops and the queries; the
	// namespace handle once no query can dial any more.
	for _, s := range p.socks {
		s.close()
	}
	loops.Wait()
	p.handlers.Wait()
	p.log.Info("DNS proxy stopped", "port", p.port)
	return p.Close()
}

// Close releases what New opened, for a Proxy that will not Run (Run
// releases it when it returns: cancel its context to stop it).
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		var errs []error
		for _, s := range p.socks {
			errs = append(errs, s.close())
		}
		if p.ns.IsOpen() {
			errs = append(errs, p.ns.Close())
		}
		if err := errors.Join(errs...); err != nil {
			p.closeErr = fmt.Errorf("dns proxy: close: %w", err)
		}
	})
	return p.closeErr
}

// acquire takes a query slot for a pod, or says that MaxInFlight are
// taken, or the pod's share of them (perPod): one pod's flood of queries
// to a resolver that never answers does not fail every other pod's.
func (p *Proxy) acquire(pod netip.Addr) bool {
	if !p.queries.take(pod) {
		return false
	}
	select {
	case p.inflight <- struct{}{}:
		return true
	default:
		p.queries.put(pod)
		return false
	}
}

func (p *Proxy) release(pod netip.Addr) {
	<-p.inflight
	p.queries.put(pod)
}

// perPod counts what each pod holds of a shared bound: at most max each.
type perPod struct {
	mu   sync.Mutex
	max  int
	held map[netip.Addr]int
}

func newPerPod(total int) *perPod {
	return &perPod{max: max(total/podShare, 1), held: map[netip.Addr]int{}}
}

// podShare: a pod may hold a podShare-th of a bound (MaxInFlight queries,
// MaxInFlight TCP connections).
const podShare = 4

func (c *perPod) take(pod netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[pod] >= c.max {
		return false
	}
	c.held[pod]++
	return true
}

func (c *perPod) put(pod netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[pod]--; c.held[pod] <= 0 {
		delete(c.held, pod)
	}
}

// runHook calls the hook with its own timeout.
func (p *Proxy) runHook(ctx context.Context, q Query) error {
	if p.hook == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	if err := p.hook(ctx, q); err != nil {
		return &failure{ReasonHook, err}
	}
	return nil
}

// drop counts a request that gets no answer.
func (p *Proxy) drop(reason Reason, args ...any) {
	p.stats.dropped[reason].Add(1)
	p.log.Debug("DNS request dropped", append([]any{"reason", reason}, args...)...)
}

// failed counts a query answered SERVFAIL.
func (p *Proxy) failed(err error, args ...any) {
	reason := reasonOf(err)
	p.stats.servFail[reason].Add(1)
	p.log.Debug("DNS query answered SERVFAIL", append([]any{"reason", reason, "error", err}, args...)...)
}
