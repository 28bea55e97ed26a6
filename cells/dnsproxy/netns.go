package dnsproxy

import (
	"context"
	"fmt"
	"net"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The sockets to resolvers are opened per query, and a socket lives in the
// network namespace of the thread that opened it. An agent runs in the
// node's namespace, all its threads with it, and dials as is. A caller
// that made the Proxy from a thread it moved to another namespace (a test,
// with the process elsewhere) wants them in that namespace too, like the
// proxy's own sockets: then the Proxy keeps that namespace, and each dial
// moves its thread there for the time of the dial.

// nsID is the identity of a network namespace: the device and inode of
// its nsfs file.
type nsID struct{ dev, ino uint64 }

// threadNetNS is the namespace of the calling thread, which the caller
// has locked.
func threadNetNS() (nsID, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return nsID{}, fmt.Errorf("this thread's network namespace: %w", err)
	}
	return nsID{st.Dev, st.Ino}, nil
}

// dialNetNS is the namespace of the thread calling New if it is not the
// process's (where an unlocked thread is, as a new locked goroutine
// finds: the caller's thread, if locked, runs no other goroutine), and
// netns.None() if it is.
func dialNetNS() (netns.NsHandle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	caller, err := threadNetNS()
	if err != nil {
		return netns.None(), err
	}
	type result struct {
		id  nsID
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		id, err := threadNetNS()
		ch <- result{id, err}
	}()
	process := <-ch
	if process.err != nil {
		return netns.None(), process.err
	}
	if process.id == caller {
		return netns.None(), nil
	}
	h, err := netns.Get()
	if err != nil {
		return netns.None(), fmt.Errorf("this thread's network namespace: %w", err)
	}
	return h, nil
}

// dial opens a connection to a resolver from the Proxy's namespace.
func (p *Proxy) dial(ctx context.Context, network, address string) (net.Conn, error) {
	if !p.ns.IsOpen() {
		return p.dialer.DialContext(ctx, network, address)
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("this thread's network namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(p.ns); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter the proxy's network namespace: %w", err)
	}
	c, dialErr := p.dialer.DialContext(ctx, network, address)
	if err := netns.Set(orig); err != nil {
		// The thread stays in the proxy's namespace: it stays locked
		// and ends with this goroutine.
		p.log.Warn("DNS proxy: cannot return a thread to its network namespace", "error", err)
		return c, dialErr
	}
	runtime.UnlockOSThread()
	return c, dialErr
}
