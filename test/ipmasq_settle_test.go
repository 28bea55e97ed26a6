package test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/enimasq/enimasq/cells/celltest"
)

// cidrChange is one change of ip-masq-agent-cidrs as the agent's
// /statedb/changes stream gives it, and when it arrived.
type cidrChange struct {
	row string // "+prefix/source" or "-prefix/source"
	at  time.Time
}

// watchCIDRChanges streams the changes of ip-masq-agent-cidrs from the
// agent's API (every change, the rows already there first) until the test
// ends.
func (a *Agent) watchCIDRChanges(t *testing.T) <-chan cidrChange {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", a.APISocket())
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/statedb/changes/ip-masq-agent-cidrs", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan cidrChange, 1000)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	go func() {
		defer close(done)
		dec := json.NewDecoder(resp.Body)
		for {
			var ch struct {
				Obj *struct {
					Prefix string
					Source string
				} `json:"obj"`
				Deleted bool `json:"deleted"`
			}
			if err := dec.Decode(&ch); err != nil {
				return
			}
			if ch.Obj == nil {
				continue // keep-alive
			}
			sign := "+"
			if ch.Deleted {
				sign = "-"
			}
			out <- cidrChange{sign + ch.Obj.Prefix + "/" + ch.Obj.Source, time.Now()}
		}
	}()
	return out
}

// collect receives changes until none has come for quiet.
func collect(changes <-chan cidrChange, quiet time.Duration) []cidrChange {
	var got []cidrChange
	for {
		select {
		case ch := <-changes:
			got = append(got, ch)
		case <-time.After(quiet):
			return got
		}
	}
}

// The settle time of the agent's ip-masq-agent file (ipmasq.SettleTime).
const ipMasqSettle = time.Second

// TestPrivilegedIPMasqAgentAppliesAnInPlaceRewriteOnce: the real agent, its
// file truncated and rewritten in chunks with pauses shorter than the
// settle time: the table does not change while the file is written (not to
// the defaults of the empty file, not to a part of the list), then changes
// once, to the final file, within the settle time plus a small bound. A
// rename over the file afterwards is applied at once.
func TestPrivilegedIPMasqAgentAppliesAnInPlaceRewriteOnce(t *testing.T) {
	a, path := ipMasqAgent(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqLinkLocal: true\nmasqLinkLocalIPv6: true\n")
	a.waitPrefixes("10.0.0.0/8")
	changes := a.watchCIDRChanges(t)
	if got := collect(changes, 300*time.Millisecond); len(got) != 1 || got[0].row != "+10.0.0.0/8/config" {
		t.Fatalf("the rows at start: %v", got)
	}

	items := []string{"10.1.0.0/16", "10.2.0.0/16", "10.3.0.0/16", "10.4.0.0/16", "10.5.0.0/16", "10.6.0.0/16"}
	pause := ipMasqSettle / 5
	celltest.RewriteInPlace(t, path, "masqLinkLocal: true\nmasqLinkLocalIPv6: true\nnonMasqueradeCIDRs:\n", items, pause)
	last := time.Now()

	got := collect(changes, 2*ipMasqSettle)
	want := []string{"-10.0.0.0/8/config"}
	for _, p := range items {
		want = append(want, "+"+p+"/config")
	}
	var rows []string
	for _, ch := range got {
		rows = append(rows, ch.row)
		if ch.at.Before(last) {
			t.Errorf("%s applied while the file was being written", ch.row)
		}
	}
	slices.Sort(rows)
	slices.Sort(want)
	if !slices.Equal(rows, want) {
		t.Errorf("changes\n%s\nwant only\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	if len(got) > 0 {
		took := got[len(got)-1].at.Sub(last)
		t.Logf("in-place rewrite applied %s after the last write", took)
		if took > ipMasqSettle+500*time.Millisecond {
			t.Errorf("in-place rewrite applied %s after the last write, want within %s + 500ms", took, ipMasqSettle)
		}
	}

	start := time.Now()
	WriteFileAtomic(t, path, "nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqLinkLocal: true\nmasqLinkLocalIPv6: true\n")
	got = collect(changes, ipMasqSettle/2)
	if len(got) != 7 {
		t.Fatalf("after a rename: changes %v", got)
	}
	took := got[len(got)-1].at.Sub(start)
	t.Logf("a rename applied in %s", took)
	if took >= ipMasqSettle {
		t.Errorf("a rename applied in %s: waited for the settle time", took)
	}
}
