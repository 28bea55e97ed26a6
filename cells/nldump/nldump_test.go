package nldump

import (
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/enimasq/enimasq/cells/celltest"
)

func TestListRetriesInterruptedDumps(t *testing.T) {
	calls := 0
	out, err := List("things", func() ([]int, error) {
		calls++
		if calls < 3 {
			return []int{1}, netlink.ErrDumpInterrupted // partial
		}
		return []int{1, 2}, nil
	})
	if err != nil || len(out) != 2 || calls != 3 {
		t.Fatalf("List = %v, %v after %d calls; want the third, whole dump", out, err, calls)
	}

	calls = 0
	out, err = List("things", func() ([]int, error) { calls++; return []int{1}, netlink.ErrDumpInterrupted })
	if out != nil || !errors.Is(err, netlink.ErrDumpInterrupted) || calls != Attempts {
		t.Fatalf("always interrupted: List = %v, %v after %d calls; want no list and the error after %d", out, err, calls, Attempts)
	}

	boom := errors.New("boom")
	if _, err := List("things", func() ([]int, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("an error: %v", err)
	}
}

// TestPrivilegedLinksWhileLinksChange lists the links of a netns while
// another thread adds and deletes links as fast as it can: the kernel
// interrupts dumps (raw netlink returns ErrDumpInterrupted), and every
// list of nldump is whole: it holds each of the links that never change.
func TestPrivilegedLinksWhileLinksChange(t *testing.T) {
	ns := celltest.NewNetNS(t)
	stable := map[string]bool{}
	inNS(t, ns, func() {
		for i := range 150 {
			la := netlink.NewLinkAttrs()
			la.Name = fmt.Sprintf("stay%d", i)
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: fmt.Sprintf("stayp%d", i)}); err != nil {
				t.Fatal(err)
			}
			if i%30 == 0 {
				stable[la.Name] = true
			}
		}
	})

	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		inNS(t, ns, func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				la := netlink.NewLinkAttrs()
				la.Name = "churn"
				v := &netlink.Veth{LinkAttrs: la, PeerName: "churnp"}
				netlink.LinkAdd(v)
				netlink.LinkDel(v)
			}
		})
	}()
	var interrupted int
	const dumps = 100
	inNS(t, ns, func() {
		for range dumps {
			if _, err := netlink.LinkList(); errors.Is(err, netlink.ErrDumpInterrupted) {
				interrupted++
			}
			links, err := Links()
			if err != nil {
				t.Errorf("a dump during link changes: %v", err)
				continue
			}
			have := map[string]bool{}
			for _, l := range links {
				have[l.Attrs().Name] = true
			}
			for name := range stable {
				if !have[name] {
					t.Errorf("the list lacks %s, which never changed", name)
				}
			}
		}
	})
	close(stop)
	<-done
	t.Logf("raw netlink dumps interrupted: %d of %d", interrupted, dumps)
	if interrupted == 0 {
		t.Error("no raw dump was interrupted: the test did not exercise the retries")
	}
}

func inNS(t *testing.T, ns netns.NsHandle, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	defer netns.Set(orig)
	f()
}
