package ipam_test

// Ownership by attachment, through the HTTP API on a netlinkfake.Netlink.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/ipam/allocator"
	"github.com/enimasq/enimasq/ipam/datapath"
)

// post allocates for an attachment of shop/db-0 and returns the IP.
func (a *agent) postAttachment(containerID string) string {
	a.t.Helper()
	code, body := a.do("POST", "/v1/ipam", fmt.Sprintf(`{"owner": "shop/db-0", "containerID": %q, "ifname": "eth0"}`, containerID))
	var res allocator.AllocationResult
	if err := json.Unmarshal([]byte(body), &res); err != nil || (code != http.StatusCreated && code != http.StatusOK) {
		a.t.Fatalf("POST for %s: %d %s", containerID, code, body)
	}
	return res.IP
}

func (a *agent) releaseAttachment(containerID string) []allocator.AllocationInfo {
	a.t.Helper()
	code, body := a.do("POST", "/v1/ipam/release", fmt.Sprintf(`{"containerID": %q, "ifname": "eth0"}`, containerID))
	var released []allocator.AllocationInfo
	if err := json.Unmarshal([]byte(body), &released); err != nil || code != http.StatusOK {
		a.t.Fatalf("release %s: %d %s", containerID, code, body)
	}
	return released
}

// TestStaleDELKeepsTheNewSandboxsIP is the reported sequence: a StatefulSet
// pod's new sandbox (B) is added before the old one's (A) DEL. B gets an IP
// of its own, A's DEL releases only A's, and the next pod's ADD never gets
// B's IP.
func TestStaleDELKeepsTheNewSandboxsIP(t *testing.T) {
	n := newFakeNetwork(t, false)
	a := startAgent(t, n, n.Handle(), newWorkDir(t))

	ipA := a.postAttachment("sandbox-a")
	ipB := a.postAttachment("sandbox-b")
	if ipA == ipB {
		t.Fatalf("two sandboxes of shop/db-0 share %s", ipA)
	}
	if again := a.postAttachment("sandbox-b"); again != ipB {
		t.Errorf("a retried ADD of B got %s, not its %s", again, ipB)
	}
	released := a.releaseAttachment("sandbox-a")
	if len(released) != 1 || released[0].IP != ipA || released[0].ContainerID != "sandbox-a" {
		t.Fatalf("A's DEL released %+v, want only %s", released, ipA)
	}
	if released := a.releaseAttachment("sandbox-a"); len(released) != 0 {
		t.Errorf("A's DEL again released %+v, want nothing", released)
	}
	if released := a.releaseAttachment("never-added"); len(released) != 0 {
		t.Errorf("a DEL of an unknown attachment released %+v", released)
	}
	next := a.postAttachment("sandbox-c")
	if next == ipB {
		t.Fatalf("the next pod got B's %s", ipB)
	}
	code, body := a.do("GET", "/v1/ipam?containerID=sandbox-b&ifname=eth0", "")
	var list []allocator.AllocationInfo
	if err := json.Unmarshal([]byte(body), &list); err != nil || code != 200 || len(list) != 1 || list[0].IP != ipB {
		t.Errorf("B's allocations: %d %s", code, body)
	}
	a.waitFor("B's rules in the kernel, A's gone", func() (bool, string) {
		rules, _ := datapath.KernelRules(n.Handle(), []int{unix.AF_INET})
		return strings.Contains(rules, "from "+ipB+" ") && strings.Contains(rules, "from "+next+" ") &&
			(ipA == next || !strings.Contains(rules, "from "+ipA+" ")), rules
	})
}

// TestGCReleasesAttachmentsNotValid: GC releases the allocation of every
// attachment not in the valid list, and their rules go; an allocation made
// through the API without an attachment is not the CNI's and stays. (The
// sample pool has 5 IPs; the CNI test runs 10 attachments through libcni.)
func TestGCReleasesAttachmentsNotValid(t *testing.T) {
	n := newFakeNetwork(t, false)
	a := startAgent(t, n, n.Handle(), newWorkDir(t))
	ips := map[string]string{}
	for _, id := range []string{"ctr-0", "ctr-1", "ctr-2", "ctr-3"} {
		ips[id] = a.postAttachment(id)
	}
	apiMade := a.allocate("shop/api-made", "")

	code, body := a.do("POST", "/v1/ipam/gc", `{"validAttachments": [{"containerID": "ctr-1", "ifname": "eth0"}, {"containerID": "ctr-3", "ifname": "eth0"}]}`)
	var released []allocator.AllocationInfo
	if err := json.Unmarshal([]byte(body), &released); err != nil || code != 200 {
		t.Fatalf("GC: %d %s", code, body)
	}
	var got []string
	for _, al := range released {
		got = append(got, al.ContainerID+" "+al.IP)
	}
	if want := []string{"ctr-0 " + ips["ctr-0"], "ctr-2 " + ips["ctr-2"]}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("GC released %v, want %v", got, want)
	}
	var left []string
	for _, al := range a.alloc.Allocations() {
		left = append(left, al.IP.String())
	}
	if want := []string{apiMade.IP, ips["ctr-1"], ips["ctr-3"]}; len(left) != 3 || !strings.Contains(strings.Join(left, ","), want[0]) ||
		!strings.Contains(strings.Join(left, ","), want[1]) || !strings.Contains(strings.Join(left, ","), want[2]) {
		t.Errorf("left %v, want %v", left, want)
	}
	a.waitFor("the released attachments' rules gone", func() (bool, string) {
		rules, _ := datapath.KernelRules(n.Handle(), []int{unix.AF_INET})
		return !strings.Contains(rules, "from "+ips["ctr-0"]+" ") && !strings.Contains(rules, "from "+ips["ctr-2"]+" ") &&
			strings.Contains(rules, "from "+ips["ctr-1"]+" "), rules
	})
}

// TestAPIInputIsStrict: a field given twice, owners that are not
// Kubernetes names, and malformed attachments are refused, naming them.
func TestAPIInputIsStrict(t *testing.T) {
	n := newFakeNetwork(t, false)
	a := startAgent(t, n, n.Handle(), newWorkDir(t))
	for _, tc := range []struct{ body, message string }{
		{`{"owner": "shop/a", "owner": "shop/b"}`, "field owner is given twice"},
		{`{"owner": "Shop/a"}`, `namespace "Shop"`},
		{`{"owner": "shop/A_b"}`, `pod name "A_b"`},
		{`{"owner": "shop/` + strings.Repeat("a", 254) + `"}`, "must be no more than 253 characters"},
		{`{"owner": "shop/a", "ifname": "eth0"}`, "without a containerID"},
		{`{"owner": "shop/a", "containerID": "../x", "ifname": "eth0"}`, "containerID"},
		{`{"owner": "shop/a", "containerID": "c1", "ifname": "eth0/1"}`, "ifname"},
		{`{"owner": "shop/a", "containerID": "c1", "ifname": "a-very-long-ifname"}`, "longer than 15"},
		{`{"owner": "shop/a", "podUID": "not a uid"}`, "podUID"},
	} {
		code, body := a.do("POST", "/v1/ipam", tc.body)
		var e allocator.APIError
		if err := json.Unmarshal([]byte(body), &e); err != nil || code != 400 || !strings.Contains(e.Message, tc.message) {
			t.Errorf("%s: %d %s, want 400 naming %q", tc.body, code, body, tc.message)
		}
	}
	if code, body := a.do("POST", "/v1/ipam/gc", `{"validAttachments": [], "validAttachments": []}`); code != 400 || !strings.Contains(body, "field validAttachments is given twice") {
		t.Errorf("GC with a duplicate field: %d %s", code, body)
	}
}
