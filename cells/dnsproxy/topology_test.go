package dnsproxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
	"golang.org/x/net/ipv4"

	"github.com/enimasq/enimasq/cells/celltest"
)

// The topology of the privileged tests: a node netns routing between two
// pods (each behind a veth, a /32 and a default route via a link-local
// gateway on the host side, as a CNI does) and a resolver on a subnet of
// its own. Pod A is dual-stack.
const (
	podA      = "10.0.0.2"
	podB      = "10.0.0.3"
	podA6     = "fd00::2"
	nodeIP    = "10.0.1.1"
	resolver  = "10.0.1.2"
	node6     = "fd00:1::1"
	resolver6 = "fd00:1::2"
	gateway   = "169.254.1.1"
	gateway6  = "fe80::1"
	testMark  = 0x4000
	testTable = 4053
)

type topology struct {
	tb                      testing.TB
	node, a, b, res         string // netns names
	nodeNS, aNS, bNS, resNS netns.NsHandle
	dns                     *resolverLog
}

func newTopology(tb testing.TB) *topology {
	tb.Helper()
	celltest.RequireRoot(tb)
	suffix := make([]byte, 3)
	rand.Read(suffix)
	base := "enq-dns-" + hex.EncodeToString(suffix)
	t := &topology{tb: tb, node: base, a: base + "-a", b: base + "-b", res: base + "-res"}
	t.nodeNS, t.aNS, t.bNS, t.resNS = t.addNS(t.node), t.addNS(t.a), t.addNS(t.b), t.addNS(t.res)
	t.sysctl(t.node, "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
		"net.ipv6.conf.all.forwarding=1")
	for _, ns := range []string{t.node, t.a, t.b, t.res} {
		t.sysctl(ns, "net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.default.disable_ipv6=0",
			"net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	}

	sh(tb, "ip", "-n", t.node, "link", "add", "res0", "type", "veth", "peer", "name", "eth0", "netns", t.res)
	sh(tb, "ip", "-n", t.node, "addr", "add", nodeIP+"/24", "dev", "res0")
	sh(tb, "ip", "-n", t.node, "addr", "add", node6+"/64", "dev", "res0", "nodad")
	sh(tb, "ip", "-n", t.node, "link", "set", "res0", "up")
	sh(tb, "ip", "-n", t.res, "addr", "add", resolver+"/24", "dev", "eth0")
	sh(tb, "ip", "-n", t.res, "addr", "add", resolver6+"/64", "dev", "eth0", "nodad")
	sh(tb, "ip", "-n", t.res, "link", "set", "eth0", "up")
	sh(tb, "ip", "-n", t.res, "route", "add", "default", "via", nodeIP)
	sh(tb, "ip", "-n", t.res, "-6", "route", "add", "default", "via", node6)

	t.wirePod(t.a, "veth-a", podA)
	t.wirePod(t.b, "veth-b", podB)
	sh(tb, "ip", "-n", t.node, "addr", "add", gateway6+"/64", "dev", "veth-a", "nodad")
	sh(tb, "ip", "-n", t.node, "-6", "route", "add", podA6+"/128", "dev", "veth-a")
	sh(tb, "ip", "-n", t.a, "addr", "add", podA6+"/128", "dev", "eth0", "nodad")
	sh(tb, "ip", "-n", t.a, "-6", "route", "add", "default", "via", gateway6, "dev", "eth0")

	t.dns = serveDNS(tb, t.resNS, resolver, resolver6)
	t.waitReady()
	return t
}

// waitReady waits until the pods reach the resolver directly: a new IPv6
// link takes about a second before its first neighbor solicitation is
// answered, which no test means to measure.
func (t *topology) waitReady() {
	t.tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range []struct {
		ns     netns.NsHandle
		server string
	}{{t.aNS, resolver}, {t.aNS, resolver6}, {t.bNS, resolver}} {
		for {
			_, err := lookup(c.ns, "udp", c.server, "a.example.", dns.TypeA, 0)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.tb.Fatalf("the resolver %s is not reachable: %s", c.server, err)
			}
		}
	}
}

func (t *topology) addNS(name string) netns.NsHandle {
	t.tb.Helper()
	sh(t.tb, "ip", "netns", "add", name)
	t.tb.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.tb.Fatal(err)
	}
	t.tb.Cleanup(func() { ns.Close() })
	sh(t.tb, "ip", "-n", name, "link", "set", "lo", "up")
	return ns
}

func (t *topology) sysctl(ns string, settings ...string) {
	t.tb.Helper()
	sh(t.tb, append([]string{"ip", "netns", "exec", ns, "sysctl", "-qw"}, settings...)...)
}

// wirePod puts the pod behind the node's device as a CNI does.
func (t *topology) wirePod(pod, device, ip string) {
	t.tb.Helper()
	sh(t.tb, "ip", "-n", t.node, "link", "add", device, "type", "veth", "peer", "name", "eth0", "netns", pod)
	sh(t.tb, "ip", "-n", t.node, "addr", "add", gateway+"/32", "dev", device)
	sh(t.tb, "ip", "-n", t.node, "link", "set", device, "up")
	sh(t.tb, "ip", "-n", t.node, "route", "add", ip+"/32", "dev", device, "scope", "link")
	sh(t.tb, "ip", "-n", pod, "addr", "add", ip+"/32", "dev", "eth0")
	sh(t.tb, "ip", "-n", pod, "link", "set", "eth0", "up")
	sh(t.tb, "ip", "-n", pod, "route", "add", gateway, "dev", "eth0", "scope", "link")
	sh(t.tb, "ip", "-n", pod, "route", "add", "default", "via", gateway, "dev", "eth0")
}

// sh runs a command, failing tb if it fails, and returns its output.
func sh(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s: %s: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// resolverLog is what the test resolver was asked, by whom.
type resolverLog struct {
	mu   sync.Mutex
	from map[string]int // client IP -> queries
}

func (l *resolverLog) count(ip string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.from[ip]
}

// The test zone. bigAnswers A records make an answer of about 3.3 KB:
// larger than 512 bytes (truncated over UDP without EDNS0), within an
// EDNS0 buffer of 4096, and larger than the MTU (IP fragments).
const bigAnswers = 200

func zone(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	rr := func(s string) {
		x, err := dns.NewRR(s)
		if err != nil {
			panic(err)
		}
		m.Answer = append(m.Answer, x)
	}
	q := r.Question[0]
	switch name := strings.ToLower(q.Name); {
	case name == "a.example." || name == "deny.example." || name == "slow.example.":
		if q.Qtype == dns.TypeA {
			rr(name + " 60 IN A 192.0.2.1")
		}
		if q.Qtype == dns.TypeAAAA {
			rr(name + " 60 IN AAAA 2001:db8::1")
		}
	case name == "c.example.":
		rr("c.example. 60 IN CNAME a.example.")
		rr("a.example. 60 IN A 192.0.2.1")
	case name == "big.example.":
		for i := range bigAnswers {
			rr(fmt.Sprintf("big.example. 60 IN A 198.18.%d.%d", i/250, i%250+1))
		}
	default:
		m.Rcode = dns.RcodeNameError
	}
	if w.RemoteAddr().Network() == "udp" {
		size := dns.MinMsgSize
		if opt := r.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
			m.SetEdns0(opt.UDPSize(), false)
		}
		m.Truncate(size)
	}
	w.WriteMsg(m)
}

// serveDNS runs the test resolver on UDP and TCP port 53 of the
// addresses, in ns, until the test ends.
func serveDNS(tb testing.TB, ns netns.NsHandle, addrs ...string) *resolverLog {
	tb.Helper()
	log := &resolverLog{from: map[string]int{}}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		host, _, _ := net.SplitHostPort(w.RemoteAddr().String())
		log.mu.Lock()
		log.from[host]++
		log.mu.Unlock()
		zone(w, r)
	})
	err := celltest.InNS(ns, func() error {
		for _, a := range addrs {
			addr := net.JoinHostPort(a, "53")
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				return err
			}
			l, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			for _, s := range []*dns.Server{{PacketConn: pc, Handler: handler}, {Listener: l, Handler: handler}} {
				go s.ActivateAndServe()
				tb.Cleanup(func() { s.Shutdown() })
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("resolver: %s", err)
	}
	return log
}

// hookLog records what the hook saw; it fails the names it is told to,
// and holds those it is told to hold until released.
type hookLog struct {
	mu      sync.Mutex
	queries []Query
	fail    map[string]bool
	hold    map[string]chan struct{}
	held    chan string
}

func newHookLog() *hookLog {
	return &hookLog{fail: map[string]bool{"deny.example.": true}, hold: map[string]chan struct{}{}, held: make(chan string, 64)}
}

func (h *hookLog) hook(ctx context.Context, q Query) error {
	name := q.Request.Question[0].Name
	h.mu.Lock()
	h.queries = append(h.queries, q)
	release := h.hold[name]
	h.mu.Unlock()
	if release != nil {
		h.held <- name
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if h.fail[name] {
		return errors.New("policy map full")
	}
	return nil
}

func (h *hookLog) seen() []Query {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Query(nil), h.queries...)
}

// lookup asks server (ip:53) for name from the pod's netns over network
// ("udp" or "tcp"), with EDNS0 of ednsSize unless 0, as a stub resolver
// does: a connected socket, so an answer from another address is never
// read.
func lookup(ns netns.NsHandle, network, server, name string, qtype, ednsSize uint16) (*dns.Msg, error) {
	var answer *dns.Msg
	err := celltest.InNS(ns, func() error {
		c := &dns.Client{Net: network, Timeout: 700 * time.Millisecond}
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		if ednsSize > 0 {
			m.SetEdns0(ednsSize, false)
		}
		var err error
		answer, _, err = c.Exchange(m, net.JoinHostPort(server, "53"))
		return err
	})
	return answer, err
}

// startProxy runs a proxy and its redirect for pods in the node's netns,
// stopped at cleanup; stop stops the proxy only (Run returns) and waits.
func (t *topology) startProxy(cfg Config, hook Hook, pods ...string) (p *Proxy, r *Redirect, stop func()) {
	t.tb.Helper()
	var addrs []netip.Addr
	for _, s := range pods {
		addrs = append(addrs, netip.MustParseAddr(s))
	}
	err := celltest.InNS(t.nodeNS, func() error {
		var err error
		if p, err = New(cfg, hook, nil); err != nil {
			return err
		}
		r = NewRedirect(p.Port(), cfg.Mark, testTable, nil)
		return r.Sync(addrs)
	})
	if err != nil {
		t.tb.Fatalf("proxy: %s", err)
	}
	t.tb.Cleanup(func() { celltest.InNS(t.nodeNS, r.Close) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.tb.Errorf("Run: %s", err)
			}
		})
	}
	t.tb.Cleanup(stop)
	return p, r, stop
}

// inNode runs a command in the node's netns and returns its output.
func (t *topology) inNode(args ...string) string {
	t.tb.Helper()
	return sh(t.tb, append([]string{"ip", "netns", "exec", t.node}, args...)...)
}

// inNS runs f in the topology's node netns.
func inNS(t *topology, f func() error) error { return celltest.InNS(t.nodeNS, f) }

// inNSOf runs f in ns.
func inNSOf(ns netns.NsHandle, f func() error) error { return celltest.InNS(ns, f) }

// listenPodUDP is an unconnected UDP socket on pod A's address.
func listenPodUDP() (*podUDP, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(podA)})
	if err != nil {
		return nil, err
	}
	return &podUDP{c}, nil
}

type podUDP struct{ *net.UDPConn }

func (c *podUDP) LocalAddr() netip.AddrPort { return c.UDPConn.LocalAddr().(*net.UDPAddr).AddrPort() }

// controlSrc is the IP_PKTINFO control message with src as the source.
func controlSrc(src netip.Addr) []byte {
	return (&ipv4.ControlMessage{Src: src.AsSlice()}).Marshal()
}

func udpAddrIP(ap netip.AddrPort) *net.IPAddr { return &net.IPAddr{IP: ap.Addr().AsSlice()} }
