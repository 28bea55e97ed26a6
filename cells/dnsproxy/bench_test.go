package dnsproxy

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/enimasq/enimasq/cells/celltest"
)

// BenchmarkProxyLookup measures a lookup of the same name from a pod
// through the proxy (pod A, redirected; the hook a no-op) and directly to
// the resolver (pod B), interleaved, in the topology of the privileged
// tests. Each pod asks over a connected UDP socket it keeps, as a stub
// resolver does. Reported: the mean and the median of each, and the
// ratio of the medians.
func BenchmarkProxyLookup(b *testing.B) {
	topo := newTopology(b)
	topo.startProxy(Config{IPv4: true, Mark: testMark}, func(context.Context, Query) error { return nil }, podA)
	viaProxy, direct := dialResolver(b, topo.aNS), dialResolver(b, topo.bNS)
	exchange := func(c *dns.Conn) time.Duration {
		m := new(dns.Msg)
		m.SetQuestion("a.example.", dns.TypeA)
		start := time.Now()
		c.SetDeadline(start.Add(time.Second))
		if err := c.WriteMsg(m); err != nil {
			b.Fatal(err)
		}
		r, err := c.ReadMsg()
		if err != nil || r.Id != m.Id || len(r.Answer) != 1 {
			b.Fatalf("answer %v, %v", r, err)
		}
		return time.Since(start)
	}
	exchange(viaProxy)
	exchange(direct)

	var proxied, straight []time.Duration
	for b.Loop() {
		straight = append(straight, exchange(direct))
		proxied = append(proxied, exchange(viaProxy))
	}
	d50, p50 := median(straight), median(proxied)
	b.ReportMetric(float64(mean(straight).Nanoseconds()), "direct-ns/op")
	b.ReportMetric(float64(mean(proxied).Nanoseconds()), "proxy-ns/op")
	b.ReportMetric(float64(d50.Nanoseconds()), "direct-p50-ns")
	b.ReportMetric(float64(p50.Nanoseconds()), "proxy-p50-ns")
	b.ReportMetric(float64(p50)/float64(d50), "proxy/direct-p50")
}

// dialResolver is a connected UDP socket from the pod to the resolver.
func dialResolver(b *testing.B, ns netns.NsHandle) *dns.Conn {
	b.Helper()
	var c net.Conn
	err := celltest.InNS(ns, func() (err error) {
		c, err = net.Dial("udp4", net.JoinHostPort(resolver, "53"))
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return &dns.Conn{Conn: c}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func mean(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}
