package test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// leakCounter counts, from senders running at once, the connections from
// pod B to the peer that get in (the policy denies them all), until stop.
func (n *policyNode) leakCounter(senders int) (stop func() int) {
	stops := make([]func() int, senders)
	for i := range stops {
		stops[i] = countReachedUntil(func() bool { return n.connect(n.podNS("b"), policyPeerIP, 80) })
	}
	return func() int {
		var wg sync.WaitGroup
		counts := make([]int, senders)
		for i, stop := range stops {
			wg.Go(func() { counts[i] = stop() })
		}
		wg.Wait()
		total := 0
		for _, c := range counts {
			total += c
		}
		return total
	}
}

// TestPrivilegedPolicyDirectoryNeverOpens: pod B's egress is isolated by a
// PolicyEndpoint file (the peer is denied) while B keeps connecting to the
// peer. The file truncated and rewritten 50 ms later, 15 times; the
// directory removed for 200 ms and made again, 10 times; the agent
// restarted with the directory missing: no connection gets in. A file
// written in place is read once stable, a missing directory changes
// nothing, and at start, with the directory missing, the tables stay
// uninitialized so that the pinned maps are not pruned.
func TestPrivilegedPolicyDirectoryNeverOpens(t *testing.T) {
	node := newPolicyNode(t)
	node.addPod("b", "enimpd0b", podB)
	deny := policyEndpoint("b", podB, []string{"Egress"}, nil, []peRule{{cidr: "192.0.2.0/24", ports: []string{"TCP 80"}}})
	a, dir := node.startAgent(map[string]string{"b": deny})
	waitAttached(a, 1)
	a.WaitFor("B denied the peer", func() bool { return !node.connect(node.podNS("b"), policyPeerIP, 80) })
	path := filepath.Join(dir, "b.yaml")

	leaked := node.leakCounter(4)
	for range 15 {
		if err := os.WriteFile(path, nil, 0o644); err != nil { // truncated in place
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		if err := os.WriteFile(path, []byte(deny), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := leaked(); n > 0 {
		t.Errorf("file truncated and rewritten in place: %d connections the policy denies got in", n)
	}

	leaked = node.leakCounter(4)
	for range 10 {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		WriteFileAtomic(t, path, deny) // the directory made again, with the file
		time.Sleep(300 * time.Millisecond)
	}
	if n := leaked(); n > 0 {
		t.Errorf("directory removed and made again: %d connections the policy denies got in", n)
	}
	a.WaitHealthy()

	// A restart with the directory missing: nothing is pruned.
	leaked = node.leakCounter(4)
	ns := a.NetNS()
	a.Kill9()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	a.StartInNetNS(ns)
	a.WaitFor("the agent answering", func() bool { _, _, err := a.Get("/healthz"); return err == nil })
	time.Sleep(2 * time.Second) // B keeps trying while the directory is missing
	if n := leaked(); n > 0 {
		t.Errorf("restart with the directory missing: %d connections the policy denies got in", n)
	}
	if _, body, _ := a.Get("/healthz"); !strings.Contains(string(body), "Degraded") || !strings.Contains(string(body), "policyendpoints does not exist") {
		t.Errorf("health with the directory missing does not say Degraded, naming it:\n%s", body)
	}
	WriteFileAtomic(t, path, deny)
	a.WaitHealthy()
	if node.connect(node.podNS("b"), policyPeerIP, 80) {
		t.Error("B reaches the peer once the directory is back")
	}
}
