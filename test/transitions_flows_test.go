package test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
)

// trCounter counts the UDP datagrams that reach an address's port, on
// a socket with a receive buffer large enough for a flood.
type trCounter struct{ n atomic.Int64 }

func (n *transitionNode) countFlows(ns, ip string, port int) *trCounter {
	n.t.Helper()
	c := &trCounter{}
	if err := celltest.InNS(n.ns[ns], func() error {
		u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(ip), Port: port})
		if err != nil {
			return err
		}
		n.t.Cleanup(func() { u.Close() })
		raw, err := u.SyscallConn()
		if err != nil {
			return err
		}
		raw.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20) })
		go func() {
			buf := make([]byte, 2048)
			for {
				if _, _, err := u.ReadFrom(buf); err != nil {
					return
				}
				c.n.Add(1)
			}
		}()
		return nil
	}); err != nil {
		n.t.Fatalf("count datagrams to %s:%d: %v", ip, port, err)
	}
	return c
}

// rcvbufErrors is the peer's Udp RcvbufErrors: datagrams that reached a
// socket and were dropped for want of room (they would not be counted).
func (n *transitionNode) rcvbufErrors() int64 {
	n.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", n.peerNS(), "cat", "/proc/net/snmp").Output()
	if err != nil {
		n.t.Fatalf("the peer's /proc/net/snmp: %v", err)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, name := range names {
			if name == "RcvbufErrors" && i < len(f) {
				v, _ := strconv.ParseInt(f[i], 10, 64)
				return v
			}
		}
	}
	return 0
}

// sendNewFlows sends count datagrams from the pod to dst:trPort, each from
// a socket of its own (a new source port: a new flow, judged by the maps,
// never by a tracked connection).
func (n *transitionNode) sendNewFlows(pod, dst string, count int) {
	n.t.Helper()
	if err := celltest.InNS(n.ns[n.podNS(pod)], func() error {
		for range count {
			c, err := net.Dial("udp4", net.JoinHostPort(dst, strconv.Itoa(trPort)))
			if err != nil {
				return err
			}
			_, err = c.Write([]byte("new flow"))
			c.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		n.t.Fatalf("new flows from %s to %s: %v", pod, dst, err)
	}
}

// expectFlows sends count new flows from the pod to each destination and
// checks how many reached the peer: all of them (allowed) or none
// (denied). The allowed ones are the control: once they are in, the
// denied ones sent before them had their chance to arrive.
func (n *transitionNode) expectFlows(when, pod string, count int, allowed, denied []string) {
	n.t.Helper()
	before := map[string]int64{}
	for ip, c := range n.counters {
		before[ip] = c.n.Load()
	}
	for _, dst := range denied {
		n.sendNewFlows(pod, dst, count)
	}
	for _, dst := range allowed {
		n.sendNewFlows(pod, dst, count)
	}
	deadline := time.Now().Add(3 * time.Second)
	for _, dst := range allowed {
		for n.counters[dst].n.Load()-before[dst] < int64(count) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	time.Sleep(100 * time.Millisecond)
	for _, dst := range allowed {
		if got := n.counters[dst].n.Load() - before[dst]; got != int64(count) {
			n.t.Errorf("%s: %s -> %s (allowed): %d new flows sent, %d reached the peer", when, pod, dst, count, got)
		}
	}
	for _, dst := range denied {
		if got := n.counters[dst].n.Load() - before[dst]; got != 0 {
			n.t.Errorf("%s: %s -> %s (denied): %d new flows sent, %d reached the peer, want 0", when, pod, dst, count, got)
		} else {
			n.t.Logf("%s: %s -> %s denied: %d new flows sent, 0 passed", when, pod, dst, count)
		}
	}
}

// rawFlood sends frames of new UDP flows from a pod through AF_PACKET, a
// new source port each: to dst:trPort, and every controlEvery-th to
// control:trControlPort instead; perMs frames, then a pause of a
// millisecond (perMs 0: as fast as the socket takes them).
type rawFlood struct {
	sent, controls atomic.Int64
	done           chan struct{}
	finished       chan error
}

func (n *transitionNode) floodNewFlows(pod, device, podIP, dst, control string, controlEvery, perMs int) *rawFlood {
	n.t.Helper()
	l := n.podLink(pod, device)
	frame := func(to string, port uint16) []byte {
		return ethernetFrame(l.gw, l.mac, 0x0800, 0, ipv4Packet(netip.MustParseAddr(podIP), netip.MustParseAddr(to), 17,
			udpDatagram(0, port, []byte("flood"))))
	}
	denied, ctl := frame(dst, trPort), frame(control, trControlPort)
	const sportAt = 14 + 20 // Ethernet, IPv4 without options
	f := &rawFlood{done: make(chan struct{}), finished: make(chan error, 1)}
	ready := make(chan error, 1)
	go func() {
		f.finished <- celltest.InNS(n.ns[n.podNS(pod)], func() error {
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
			if err != nil {
				ready <- err
				return err
			}
			defer unix.Close(fd)
			sa := &unix.SockaddrLinklayer{Ifindex: l.ifindex, Halen: 6}
			copy(sa.Addr[:], l.gw)
			ready <- nil
			for i := 0; ; i++ {
				if i%256 == 0 {
					select {
					case <-f.done:
						return nil
					default:
					}
				}
				b := denied
				if controlEvery > 0 && i%controlEvery == controlEvery-1 {
					b = ctl
				}
				binary.BigEndian.PutUint16(b[sportAt:], uint16(1024+i%64000))
				if err := unix.Sendto(fd, b, 0, sa); err != nil {
					if err == unix.ENOBUFS || err == unix.EAGAIN {
						continue
					}
					return err
				}
				if controlEvery > 0 && i%controlEvery == controlEvery-1 {
					f.controls.Add(1)
				} else {
					f.sent.Add(1)
				}
				if perMs > 0 && i%perMs == perMs-1 {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}()
	if err := <-ready; err != nil {
		n.t.Fatalf("flood from %s: %v", pod, err)
	}
	return f
}

// stop ends the flood: frames to dst and to control sent.
func (f *rawFlood) stop(t testing.TB) (sent, controls int64) {
	t.Helper()
	close(f.done)
	if err := <-f.finished; err != nil {
		t.Fatalf("flood: %v", err)
	}
	return f.sent.Load(), f.controls.Load()
}

// rxPackets is the rx_packets of a device of the node: frames the pod put
// on its veth that reached the programs.
func (n *transitionNode) rxPackets(device string) int64 {
	n.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", n.Node, "cat", "/sys/class/net/"+device+"/statistics/rx_packets").Output()
	if err != nil {
		n.t.Fatalf("rx_packets of %s: %v", device, err)
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	return v
}
