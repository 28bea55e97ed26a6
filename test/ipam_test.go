package test

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// podRules are the `ip rule` lines (sorted, without "proto 237") of pods
// with the sample's CIDRs plus extra.
func podRules(table string, ips []string, extra ...string) []string {
	cidrs := append([]string{"10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"}, extra...)
	var lines []string
	for _, ip := range ips {
		lines = append(lines, "20:\tfrom all to "+ip+" lookup main")
		for _, c := range cidrs {
			lines = append(lines, "111:\tfrom "+ip+" to "+c+" lookup "+table)
		}
	}
	slices.Sort(lines)
	return lines
}

func merge(a ...[]string) []string {
	var out []string
	for _, l := range a {
		out = append(out, l...)
	}
	slices.Sort(out)
	return out
}

// The real binaries: pods allocated with enimasq-dbg get Cilium's rules
// (checked with `ip rule`), an ip-masq-agent edit changes the rules of the
// running pods, a kill -9 and a restart keep every rule exactly once, and a
// release removes the pod's rules.
func TestPrivilegedIPAMEndToEnd(t *testing.T) {
	requireIPAM(t)
	a, config, _ := ipamAgent(t)
	a.Start()
	a.WaitHealthy()
	ns := a.NetNS()
	AddENILinks(t, ns)

	out := a.MustDbg("ipam", "allocate", "--owner", "shop/web")
	var res struct {
		IP              string   `json:"ip"`
		Gateway         string   `json:"gateway"`
		CIDRs           []string `json:"cidrs"`
		MasterMAC       string   `json:"master-mac"`
		InterfaceNumber string   `json:"interface-number"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("allocate printed %q: %s", out, err)
	}
	if res.IP != "10.130.100.133" || res.Gateway != "10.130.96.1" || res.MasterMAC != "0a:58:0a:82:64:0a" ||
		res.InterfaceNumber != "1" || strings.Join(res.CIDRs, " ") != "10.0.0.0/8 100.64.0.0/10 169.254.0.0/16 172.16.0.0/12 192.168.0.0/16" {
		t.Errorf("allocation result %+v", res)
	}
	a.MustDbg("ipam", "allocate", "--owner", "shop/api")
	a.MustDbg("ipam", "allocate", "--owner", "shop/db", "--ip", "10.130.112.20")

	// allocate waits for the rules: `ip rule` shows them right away.
	want := merge(podRules("11", []string{"10.130.100.133", "10.130.100.134"}), podRules("12", []string{"10.130.112.20"}))
	if got := IPRules(t, ns); !slices.Equal(got, want) {
		t.Fatalf("ip rule:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := IPRoutes(t, ns, "11"); got != "default via 10.130.96.1 dev eni1 proto 237 \n10.130.96.1 dev eni1 proto 237 scope link \n" {
		t.Errorf("ip route show table 11:\n%s", got)
	}

	// A peered VPC joins the non-masquerade CIDRs: every running pod gets it.
	sample, _ := os.ReadFile("testdata/samples/ip-masq-agent.yaml")
	WriteFileAtomic(t, config, strings.Replace(string(sample), "- 10.0.0.0/8\n", "- 10.0.0.0/8\n- 198.18.0.0/15\n", 1))
	want = merge(podRules("11", []string{"10.130.100.133", "10.130.100.134"}, "198.18.0.0/15"), podRules("12", []string{"10.130.112.20"}, "198.18.0.0/15"))
	var got []string
	a.WaitFor("198.18.0.0/15 in every pod's rules", func() bool {
		got = IPRules(t, ns)
		return slices.Equal(got, want)
	})

	list := a.MustDbg("ipam", "list")
	// A header, then a row per allocation.
	if lines := strings.Split(strings.TrimSpace(list), "\n"); len(lines) != 4 ||
		strings.Join(strings.Fields(lines[0]), " ") != "IP OWNER ATTACHMENT ENI STATE" ||
		strings.Join(strings.Fields(lines[1]), " ") != "10.130.100.133 shop/web - eni-0a1b2c3d4e5f00001 Allocated" {
		t.Errorf("ipam list:\n%s", list)
	}

	// kill -9 and a new agent on the same node: allocations restored, every
	// rule exactly once, nothing lost.
	a.Kill9()
	a.StartInNetNS(ns)
	a.WaitHealthy()
	a.WaitFor("the allocations restored", func() bool {
		out, _, err := a.Dbg("ipam", "list")
		return err == nil && strings.Count(out, "\n") == 4 && !strings.Contains(out, "Restored")
	})
	a.WaitFor("the eni-rules reconciled", func() bool {
		for _, status := range Column(a.Rows("eni-rules"), "Status") {
			if !strings.Contains(status, "Done") {
				return false
			}
		}
		return true
	})
	if got := IPRules(t, ns); !slices.Equal(got, want) {
		t.Errorf("ip rule after kill -9 and restart:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if out := a.MustDbg("ipam", "allocate", "--owner", "shop/web"); !strings.Contains(out, `"ip": "10.130.100.133"`) {
		t.Errorf("the same pod after restart got %s", out)
	}

	if out := a.MustDbg("ipam", "release", "10.130.100.134"); strings.TrimSpace(out) != "released 10.130.100.134 (shop/api)" {
		t.Errorf("release printed %q", out)
	}
	want = merge(podRules("11", []string{"10.130.100.133"}, "198.18.0.0/15"), podRules("12", []string{"10.130.112.20"}, "198.18.0.0/15"))
	a.WaitFor("the released pod's rules gone", func() bool {
		got = IPRules(t, ns)
		return slices.Equal(got, want)
	})

	// Errors come back as one line with the reason, exit 1.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ipam", "release", "10.130.100.134"}, "(unknown-ip, 404)"},
		{[]string{"ipam", "allocate", "--owner", "shop/x", "--ip", "10.130.100.133"}, "held by shop/web (ip-in-use, 409)"},
		{[]string{"ipam", "allocate", "--owner", "x"}, "(invalid-request, 400)"},
	} {
		out, errOut, err := a.Dbg(tc.args...)
		if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("enimasq-dbg %v: %v %q %q, want exit 1 and %q", tc.args, err, out, errOut, tc.want)
		}
	}
}

func TestAgentRejectsUnknownIPAMMode(t *testing.T) {
	requireIPAM(t)
	out, err := exec.Command(Build(t).Agent, "--ipam=crd", "--state-dir", t.TempDir()).CombinedOutput()
	if err == nil {
		t.Fatalf("exit 0 with --ipam=crd:\n%s", out)
	}
	if last := lastLine(out); last != `enimasq-agent: --ipam "crd" is not supported: the only IPAM mode is "eni"` {
		t.Errorf("last line %q", last)
	}
}

// TestPrivilegedUnusablePoolIPsLeaveTheNodesRoutesAlone: a CiliumNode whose
// pool lists 0.0.0.0 and the subnet's gateway next to good IPs. Every good
// IP is handed out, the two never are, and `ip route get` from the node
// answers as before: no rule "from 0.0.0.0" reroutes the node's own
// traffic through an ENI.
func TestPrivilegedUnusablePoolIPsLeaveTheNodesRoutesAlone(t *testing.T) {
	requireIPAM(t)
	a, _, node := ipamAgent(t)
	sample, _ := os.ReadFile("testdata/samples/ciliumnode.yaml")
	bad := strings.Replace(string(sample), "      10.130.100.133:\n", "      0.0.0.0:\n        resource: eni-0a1b2c3d4e5f00001\n      10.130.96.1:\n        resource: eni-0a1b2c3d4e5f00001\n      10.130.100.133:\n", 1)
	if bad == string(sample) {
		t.Fatal("the sample's pool changed: fix the test")
	}
	WriteFileAtomic(t, node, bad)
	a.Start()
	ns := a.NetNS()
	AddENILinks(t, ns)
	for _, cmd := range [][]string{{"ip", "addr", "add", "10.130.0.10/20", "dev", "eni0"}, {"ip", "route", "add", "default", "via", "10.130.0.1"}} {
		if out, err := inNetNS(t, ns, cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", cmd, err, out)
		}
	}
	routeGet := func() string {
		out, err := inNetNS(t, ns, "ip", "route", "get", "192.168.5.5").CombinedOutput()
		if err != nil {
			t.Fatalf("ip route get: %v\n%s", err, out)
		}
		return string(out)
	}
	before := routeGet()
	if !strings.Contains(before, "dev eni0") {
		t.Fatalf("ip route get before any pod: %s", before)
	}
	a.WaitFor("health naming both refused IPs", func() bool {
		out, _, _ := a.Dbg("health")
		return strings.Contains(out, "0.0.0.0 refused: the unspecified address") && strings.Contains(out, "10.130.96.1 refused: the gateway")
	})
	var got []string
	for i := range 6 {
		out, _, err := a.Dbg("ipam", "allocate", "--owner", "shop/p"+string(rune('a'+i)))
		if err != nil {
			if !strings.Contains(out, "pool-exhausted") && i != 5 {
				t.Fatalf("allocate %d: %v %s", i, err, out)
			}
			continue
		}
		var res struct{ IP string }
		json.Unmarshal([]byte(out), &res)
		got = append(got, res.IP)
	}
	if want := []string{"10.130.100.133", "10.130.100.134", "10.130.100.135", "10.130.112.20", "10.130.112.21"}; !slices.Equal(got, want) {
		t.Errorf("handed out %v, want %v (and nothing more)", got, want)
	}
	for _, r := range IPRules(t, ns) {
		if strings.Contains(r, "from 0.0.0.0") || strings.Contains(r, "from 10.130.96.1 ") {
			t.Errorf("rule from a refused IP: %s", r)
		}
	}
	if after := routeGet(); after != before {
		t.Errorf("ip route get 192.168.5.5 changed:\n%s\nwas:\n%s", after, before)
	}
}

// Right after a restart with nothing wrong, every module is OK: none is
// Unknown until something happens (the checkpoint's health was, until the
// first allocation).
func TestPrivilegedRestartedAgentIsHealthy(t *testing.T) {
	requireIPAM(t)
	a, _, _ := ipamAgent(t)
	a.Start()
	a.WaitHealthy()
	ns := a.NetNS()
	AddENILinks(t, ns)
	a.MustDbg("ipam", "allocate", "--owner", "shop/a")
	if _, err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	a.StartInNetNS(ns) // the same node: its ENIs are there
	a.WaitHealthy()
	var health, scopes string
	defer func() {
		if t.Failed() {
			t.Logf("health:\n%s\nscopes:\n%s", health, scopes)
		}
	}()
	a.WaitFor("every module OK after the restart", func() bool {
		health, _, _ = a.Dbg("health")
		scopes, _, _ = a.Dbg("shell", "--", "health")
		lines := strings.Split(strings.TrimSpace(health), "\n")
		if len(lines) < 2 || strings.Join(strings.Fields(lines[0]), " ") != "MODULE LEVEL" {
			return false
		}
		for _, line := range lines[1:] { // under the header
			if f := strings.Fields(line); len(f) < 2 || f[1] != "OK" {
				return false
			}
		}
		return strings.Contains(scopes, "ipam.checkpoint: level=OK")
	})
	if !strings.Contains(scopes, "restored 1 allocations") {
		t.Errorf("ipam.checkpoint does not say what it restored:\n%s", scopes)
	}
}
