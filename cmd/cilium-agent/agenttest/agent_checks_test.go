package agenttest

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// mapIs holds when the pinned cilium_ipmasq_v4 holds exactly want.
func mapIs(bpfRoot string, want []string) func() (bool, string) {
	return func() (bool, string) {
		got, err := dumpIPMasqV4(bpfRoot)
		if err != nil {
			return false, err.Error()
		}
		var s []string
		for _, p := range got {
			s = append(s, p.String())
		}
		return slices.Equal(s, want), fmt.Sprint(s)
	}
}

func dumpIPMasqV4(bpfRoot string) ([]netip.Prefix, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpfRoot, "tc", "globals", "cilium_ipmasq_v4"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	var (
		key   [8]byte
		value [1]byte
		out   []netip.Prefix
	)
	it := m.Iterate()
	for it.Next(&key, &value) {
		out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte(key[4:8])), int(binary.NativeEndian.Uint32(key[:4]))))
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out, nil
}

// checkHealth: cilium-dbg status --all-health lists enimasq's modules
// (the enimasq tree: ipmasq, policymap, ipam and the pod-set job), none
// degraded or stopped.
func checkHealth(t testing.TB, a *agent) {
	t.Helper()
	var tree string
	a.waitFor("enimasq's modules healthy", 30*time.Second, func() (bool, string) {
		status := a.dbg("status", "--all-health")
		tree = enimasqTree(status)
		for _, want := range []string{"── ipmasq", "── policymap", "── ipam", "job-follow-cilium-endpoints", "job-reconcile-eni-rules"} {
			if !strings.Contains(tree, want) {
				return false, fmt.Sprintf("no %q under enimasq:\n%s", want, status)
			}
		}
		if strings.Contains(tree, "[DEGRADED]") || strings.Contains(tree, "[STOPPED]") {
			return false, tree
		}
		return true, ""
	})
	t.Logf("cilium-dbg status --all-health, enimasq's modules:\n%s", tree)
}

// enimasqTree is the enimasq subtree of status --all-health's module tree.
func enimasqTree(status string) string {
	var out []string
	in := false
	for _, l := range strings.Split(status, "\n") {
		trimmed := strings.TrimSpace(l)
		switch {
		case trimmed == "enimasq":
			in = true
		case in && (strings.HasPrefix(trimmed, "├") || strings.HasPrefix(trimmed, "│") || strings.HasPrefix(trimmed, "└")):
		case in:
			return strings.Join(out, "\n")
		}
		if in {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// checkUsedMetric: enimasq_ipam_ips{type="used"} counts the IPs Cilium
// allocated (router, health, pods), as cilium-dbg metrics list shows it.
func checkUsedMetric(t testing.TB, a *agent) {
	t.Helper()
	a.waitFor(`enimasq_ipam_ips{type="used"} = Cilium's IPs`, 10*time.Second, func() (bool, string) {
		ips, err := ciliumIPs(a, a.node)
		if err != nil {
			return false, err.Error()
		}
		out, err := a.dbgErr("metrics", "list", "-o", "json", "-p", "enimasq_ipam_ips", "--shell-sock-path="+a.shellSock)
		if err != nil {
			return false, out
		}
		var ms []struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
			Value  float64           `json:"value"`
		}
		if err := json.Unmarshal([]byte(out), &ms); err != nil {
			return false, fmt.Sprintf("%s: %s", err, out)
		}
		used := 0.0
		for _, m := range ms {
			if m.Name == "enimasq_ipam_ips" && m.Labels["type"] == "used" {
				used += m.Value
			}
		}
		return int(used) == len(ips), fmt.Sprintf("used %g, Cilium's IPs %v", used, ips)
	})
}

func hasDoneRow(rows string, ip netip.Addr) bool {
	for _, l := range strings.Split(rows, "\n") {
		if strings.Contains(l, ip.String()+"/32") && strings.Contains(l, "Done") {
			return true
		}
	}
	return false
}
