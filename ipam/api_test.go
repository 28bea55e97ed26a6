package ipam_test

// The allocator and its HTTP API, on a netlinkfake.Netlink: they need no kernel.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/cells/celltest"
	"github.com/enimasq/enimasq/ipam/allocator"
	"github.com/enimasq/enimasq/ipam/datapath"
)

// Concurrent requests: every owner gets one IP, no IP goes to two owners,
// the same owner asking twice at once gets the same IP, and the pool runs
// out with ErrPoolExhausted. The checkpoint holds exactly the table.
func TestConcurrentAllocations(t *testing.T) {
	n := newFakeNetwork(t, false)
	dir := newWorkDir(t)
	a := startAgent(t, n, n.Handle(), dir)

	const owners = 8
	type answer struct {
		owner string
		ip    string
		err   error
	}
	answers := make(chan answer, 2*owners)
	var wg sync.WaitGroup
	for i := range 2 * owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("ns/pod-%d", i%owners)
			res, _, err := a.alloc.Allocate(allocator.Request{Owner: owner})
			answers <- answer{owner, res.IP, err}
		}()
	}
	wg.Wait()
	close(answers)
	byOwner := map[string]string{}
	byIP := map[string]string{}
	exhausted := map[string]bool{}
	for ans := range answers {
		switch {
		case errors.Is(ans.err, allocator.ErrPoolExhausted):
			exhausted[ans.owner] = true
		case ans.err != nil:
			t.Errorf("%s: %s", ans.owner, ans.err)
		default:
			if prev, ok := byOwner[ans.owner]; ok && prev != ans.ip {
				t.Errorf("%s got %s and %s", ans.owner, prev, ans.ip)
			}
			byOwner[ans.owner] = ans.ip
			if prev, ok := byIP[ans.ip]; ok && prev != ans.owner {
				t.Errorf("%s given to %s and %s", ans.ip, prev, ans.owner)
			}
			byIP[ans.ip] = ans.owner
		}
	}
	if len(byIP) != 5 || len(exhausted) != owners-5 {
		t.Errorf("%d IPs handed out, %d owners refused; want 5 and %d", len(byIP), len(exhausted), owners-5)
	}
	for owner := range exhausted {
		if _, ok := byOwner[owner]; ok {
			t.Errorf("%s got an IP and an exhausted error", owner)
		}
	}
	entries, err := allocator.ReadCheckpoint(filepath.Join(dir, "state", allocator.CheckpointFile))
	if err != nil || len(entries) != 5 {
		t.Fatalf("checkpoint: %v %v", entries, err)
	}
	for _, e := range entries {
		if byIP[e.IP.String()] != e.Owner {
			t.Errorf("checkpoint has %s for %s, table says %s", e.IP, e.Owner, byIP[e.IP.String()])
		}
	}
}

func (a *agent) do(method, path, body string) (int, string) {
	a.t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	a.api.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// The HTTP API: result fields, status codes and JSON errors.
func TestAPI(t *testing.T) {
	n := newFakeNetwork(t, false)
	if err := n.DelLink("eni2"); err != nil {
		t.Fatal(err)
	}
	dir := newWorkDir(t)
	a := startAgent(t, n, n.Handle(), dir)

	code, body := a.do("POST", "/v1/ipam?wait=true", `{"owner": "shop/web"}`)
	var res allocator.AllocationResult
	if err := json.Unmarshal([]byte(body), &res); code != http.StatusCreated || err != nil {
		t.Fatalf("POST: %d %s", code, body)
	}
	if res.IP != "10.130.100.133" || res.Gateway != "10.130.96.1" || res.MasterMAC != "0a:58:0a:82:64:0a" ||
		res.InterfaceNumber != "1" || strings.Join(res.CIDRs, " ") != sampleCIDRs {
		t.Errorf("result %+v", res)
	}
	for _, field := range []string{`"ip"`, `"gateway"`, `"cidrs"`, `"master-mac"`, `"interface-number"`} {
		if !strings.Contains(body, field) {
			t.Errorf("result has no %s field: %s", field, body)
		}
	}
	// ?wait=true answered after the rules were in the kernel.
	rules, _ := datapath.KernelRules(n.Handle(), []int{unix.AF_INET})
	if rules != kernelRules(sampleCIDRs, "10.130.100.133 11") {
		t.Errorf("rules after POST ?wait=true:\n%s", rules)
	}
	if code, again := a.do("POST", "/v1/ipam", `{"owner": "shop/web"}`); code != http.StatusOK || again != body {
		t.Errorf("POST again: %d %s", code, again)
	}

	for _, tc := range []struct {
		method, path, body string
		code               int
		reason, message    string
	}{
		{"POST", "/v1/ipam", `{"owner": "shop/web"`, 400, "invalid-request", "body"},
		{"POST", "/v1/ipam", `{"owner": "shop/x", "pod": "x"}`, 400, "invalid-request", `unknown field "pod"`},
		{"POST", "/v1/ipam", `{"owner": "x"}`, 400, "invalid-request", "NAMESPACE/POD"},
		{"POST", "/v1/ipam?wait=maybe", `{"owner": "shop/x"}`, 400, "invalid-request", "wait"},
		{"POST", "/v1/ipam", `{"owner": "shop/x", "family": "ipv6"}`, 400, "invalid-request", "IPv6 is disabled"},
		{"POST", "/v1/ipam", `{"owner": "shop/x", "ip": "10.130.100.133"}`, 409, "ip-in-use", "held by shop/web"},
		{"POST", "/v1/ipam", `{"owner": "shop/web", "ip": "10.130.100.134"}`, 409, "owner-has-ip", "holds 10.130.100.133"},
		{"POST", "/v1/ipam", `{"owner": "shop/x", "ip": "10.130.0.10"}`, 404, "not-in-pool", "not in spec.ipam.pool"},
		{"DELETE", "/v1/ipam/10.130.100.200", "", 404, "unknown-ip", "not allocated"},
		{"DELETE", "/v1/ipam/nope", "", 400, "invalid-request", "not an IP address"},
		{"GET", "/v1/ipam/10.130.100.200", "", 404, "unknown-ip", "not allocated"},
		// ENI 2's link is missing: the allocation stands, the answer says
		// why the pod's egress is not ready.
		{"POST", "/v1/ipam?wait=true&timeout=300ms", `{"owner": "shop/c", "ip": "10.130.112.20"}`, 503, "rules-failed", "no link with MAC 0a:58:0a:82:70:0a"},
	} {
		code, body := a.do(tc.method, tc.path, tc.body)
		var e allocator.APIError
		if err := json.Unmarshal([]byte(body), &e); err != nil || code != tc.code || e.Reason != tc.reason || !strings.Contains(e.Message, tc.message) {
			t.Errorf("%s %s %s: %d %s; want %d, reason %s, error containing %q", tc.method, tc.path, tc.body, code, body, tc.code, tc.reason, tc.message)
		}
		if tc.reason == "rules-failed" && (e.Result == nil || e.Result.IP != "10.130.112.20") {
			t.Errorf("rules-failed without the result: %s", body)
		}
	}

	for _, owner := range []string{"shop/b", "shop/d", "shop/e"} {
		if code, body := a.do("POST", "/v1/ipam", `{"owner": "`+owner+`"}`); code != http.StatusCreated {
			t.Fatalf("POST %s: %d %s", owner, code, body)
		}
	}
	if code, body := a.do("POST", "/v1/ipam", `{"owner": "shop/f"}`); code != http.StatusServiceUnavailable || !strings.Contains(body, `"pool-exhausted"`) {
		t.Errorf("exhausted: %d %s", code, body)
	}

	code, body = a.do("GET", "/v1/ipam", "")
	var list []allocator.AllocationInfo
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || len(list) != 5 ||
		list[0] != (allocator.AllocationInfo{IP: "10.130.100.133", Owner: "shop/web", Family: "ipv4", ENI: "eni-0a1b2c3d4e5f00001", State: "Allocated"}) {
		t.Errorf("GET /v1/ipam: %d %s", code, body)
	}
	if code, body := a.do("GET", "/v1/ipam/10.130.100.133", ""); code != 200 || !strings.Contains(body, `"master-mac": "0a:58:0a:82:64:0a"`) {
		t.Errorf("GET /v1/ipam/10.130.100.133: %d %s", code, body)
	}
	if code, body := a.do("DELETE", "/v1/ipam/10.130.100.133", ""); code != 200 || !strings.Contains(body, `"owner": "shop/web"`) {
		t.Errorf("DELETE: %d %s", code, body)
	}
	a.waitFor("the released pod's rules gone", func() (bool, string) {
		rules, _ := datapath.KernelRules(n.Handle(), []int{unix.AF_INET})
		return !strings.Contains(rules, "10.130.100.133"), rules
	})

	// The same for a CNI ADD (an attachment): nothing is left behind. The
	// allocation it made is released (and its rules with it); the IP is
	// free for the next.
	if code, body := a.do("DELETE", "/v1/ipam/10.130.112.20", ""); code != http.StatusOK {
		t.Fatalf("DELETE shop/c's 10.130.112.20: %d %s", code, body)
	}
	code, body = a.do("POST", "/v1/ipam?wait=true&timeout=300ms",
		`{"owner": "shop/g", "network": "enimasq", "containerID": "ctr-g", "ifname": "eth0", "ip": "10.130.112.20"}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "rules-failed") || !strings.Contains(body, "10.130.112.20 is released again") {
		t.Errorf("CNI ADD whose rules fail: %d %s, want 503 rules-failed, released again", code, body)
	}
	if code, body := a.do("GET", "/v1/ipam/10.130.112.20", ""); code != http.StatusNotFound {
		t.Errorf("after the failed CNI ADD the IP is still allocated: %d %s", code, body)
	}
}

// Before the CiliumNode is read, the API answers 503 not-ready.
func TestAPINotReady(t *testing.T) {
	n := newFakeNetwork(t, false)
	dir := newWorkDir(t)
	os.Remove(filepath.Join(dir, "node", "ciliumnode.yaml"))
	a := startAgentNoWait(t, n, n.Handle(), dir)
	code, body := a.do("POST", "/v1/ipam", `{"owner": "shop/web"}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"not-ready"`) {
		t.Errorf("POST before the CiliumNode: %d %s", code, body)
	}
}

// TestAPIListNotReadyBeforeRestore: before the checkpoint is restored, GET
// answers 503 not-ready, not an empty list that would say "no allocation"
// for every running pod.
func TestAPIListNotReadyBeforeRestore(t *testing.T) {
	n := newFakeNetwork(t, false)
	dir := newWorkDir(t)
	// An unreadable checkpoint keeps the allocator from restoring.
	celltest.WriteFileAtomic(t, filepath.Join(dir, "state", allocator.CheckpointFile), "{not json")
	a := startAgentNoWait(t, n, n.Handle(), dir)
	for _, path := range []string{"/v1/ipam", "/v1/ipam?containerID=c1&ifname=eth0", "/v1/ipam/10.130.100.133"} {
		a.waitFor("GET "+path+" answers not-ready", func() (bool, string) {
			code, body := a.do("GET", path, "")
			return code == http.StatusServiceUnavailable && strings.Contains(body, `"not-ready"`), fmt.Sprint(code, body)
		})
	}
}
