package k8stest

import (
	"io"
	"net"
	"net/url"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// Reaching the API server from a node's network namespace: the API server
// listens on the test's loopback, and an agent in a namespace of its own
// needs the same address there, so that its kubeconfig and the server's
// certificate hold.

// ListenIn listens on the TCP address addr in the network namespace ns:
// the socket is made on a thread in ns, and stays there.
func ListenIn(ns netns.NsHandle, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := netns.Set(ns); err != nil {
			ch <- result{err: err}
			return
		}
		l, err := net.Listen("tcp", addr)
		ch <- result{l, err}
	}()
	r := <-ch
	return r.l, r.err
}

// ForwardInto makes the API server reachable on its own address from the
// network namespace ns, each connection forwarded to it from the test's
// namespace, until the test ends.
func (c *Cluster) ForwardInto(t testing.TB, ns netns.NsHandle) {
	t.Helper()
	u, err := url.Parse(c.Server)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ListenIn(ns, u.Host)
	if err != nil {
		t.Fatalf("listen on %s in the node's namespace: %s", u.Host, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				up, err := net.Dial("tcp", u.Host) // from the test's namespace
				if err != nil {
					return
				}
				defer up.Close()
				done := make(chan struct{}, 2)
				go func() { io.Copy(up, conn); done <- struct{}{} }()
				go func() { io.Copy(conn, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
}
