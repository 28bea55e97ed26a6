package celltest

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// NewNetNS creates a network namespace, closed at cleanup, and returns
// its handle; the calling goroutine stays where it was. Needs root.
func NewNetNS(t testing.TB) netns.NsHandle {
	t.Helper()
	RequireRoot(t)
	ns, err := newNetNS()
	if err != nil {
		t.Fatalf("new netns: %s", err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func newNetNS() (netns.NsHandle, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return netns.None(), err
	}
	defer orig.Close()
	ns, err := netns.New() // moves this thread into it
	if err != nil {
		runtime.UnlockOSThread()
		return netns.None(), err
	}
	if err := netns.Set(orig); err != nil {
		// The thread is stuck in the new namespace: let it die with the
		// goroutine (no UnlockOSThread).
		ns.Close()
		return netns.None(), fmt.Errorf("back to the original netns: %w", err)
	}
	runtime.UnlockOSThread()
	return ns, nil
}

// InNS runs f on a thread in ns (sockets made there stay in ns; tcx and
// netlink ifindexes are ns's) and returns its error; the goroutine is back
// in its netns after.
func InNS(ns netns.NsHandle, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return err
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("cannot return to the test's netns: %s", err))
		}
	}()
	return f()
}
