package test

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/enimasq/enimasq/cells/celltest"
)

// cpeRule is an ingress or egress entry of a ClusterPolicyEndpoint.
type cpeRule struct {
	cidr   string
	ports  []string // "TCP 80", "UDP 53", "TCP 80-82", "UDP"; none: every protocol and port
	action string   // Accept, Deny, Pass
}

// clusterPolicyEndpoint is a ClusterPolicyEndpoint selecting pods (on the
// policy node), as the AWS network policy controller writes it for a
// ClusterNetworkPolicy.
func clusterPolicyEndpoint(name, tier string, priority int, pods []string, ingress, egress []cpeRule) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: networking.k8s.aws/v1alpha1\nkind: ClusterPolicyEndpoint\nmetadata: {name: %s}\n", name)
	fmt.Fprintf(&b, "spec:\n  policyRef: {name: %s}\n  tier: %s\n  priority: %d\n  podSelectorEndpoints:\n", name, tier, priority)
	for i, pod := range pods {
		fmt.Fprintf(&b, "  - {podIP: %s, hostIP: %s, name: pod-%d, namespace: e2e}\n", pod, policyNodeIP, i)
	}
	for _, dir := range []struct {
		name  string
		rules []cpeRule
	}{{"ingress", ingress}, {"egress", egress}} {
		if len(dir.rules) == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %s:\n", dir.name)
		for _, r := range dir.rules {
			fmt.Fprintf(&b, "  - cidr: %q\n    action: %s\n", r.cidr, r.action)
			if len(r.ports) > 0 {
				b.WriteString("    ports:\n")
				for _, p := range r.ports {
					proto, port, _ := strings.Cut(p, " ")
					start, end, ranged := strings.Cut(port, "-")
					fmt.Fprintf(&b, "    - {protocol: %s", proto)
					if start != "" {
						fmt.Fprintf(&b, ", port: %s", start)
					}
					if ranged {
						fmt.Fprintf(&b, ", endPort: %s", end)
					}
					b.WriteString("}\n")
				}
			}
		}
	}
	return b.String()
}

// Addresses of the cluster tests: the peer netns answers on policyPeerIP
// and on these (same subnet), so that rules can tell peers apart.
const (
	peerC2 = "10.0.1.3"
	peerC3 = "10.0.1.4"
	podC   = "10.0.0.5"
	podD   = "10.0.0.6"
)

// clusterNode is a policy node whose pods, peers and agent the cluster
// tests share.
type clusterNode struct {
	*policyNode
	pods  map[string]string // pod name -> IP
	agent *Agent
	dir   string // the policy-endpoints directory
}

// newClusterNode makes a policy node with the pods (name -> IP), the peer
// also at peerC2 and peerC3, and the node answering on policyNodeIP.
func newClusterNode(t *testing.T, pods map[string]string) *clusterNode {
	t.Helper()
	n := &clusterNode{policyNode: newPolicyNode(t), pods: pods}
	i := 0
	for name, ip := range pods {
		n.addPod(name, fmt.Sprintf("enic%x%s", i, strings.ReplaceAll(ip, ".", "")[4:]), ip)
		i++
	}
	for _, ip := range []string{peerC2, peerC3} {
		run(t, "ip", "-n", n.peerNS(), "addr", "add", ip+"/24", "dev", "eth0")
		n.serve(n.peerNS(), ip)
	}
	n.serve(n.Node, policyNodeIP)
	return n
}

// start starts the agent on the files (name without .yaml -> content) and
// waits until every pod's device carries the programs.
func (n *clusterNode) start(files map[string]string, extra ...string) {
	n.t.Helper()
	n.agent, n.dir = n.startAgent(files, extra...)
	waitAttached(n.agent, len(n.pods))
}

// write replaces (or adds) a file of the policy-endpoints directory;
// remove deletes it.
func (n *clusterNode) write(name, content string) {
	n.t.Helper()
	WriteFileAtomic(n.t, filepath.Join(n.dir, name+".yaml"), content)
}

func (n *clusterNode) remove(name string) {
	n.t.Helper()
	run(n.t, "rm", "-f", filepath.Join(n.dir, name+".yaml"))
}

// cprobe is one connection attempt between a pod and a peer: egress from
// the pod to peer, ingress from peer (an address of the peer netns, or the
// node IP from the node netns) to the pod. The verdict program must agree
// and name the deciding step and object: decider is the text between the
// packet and the reason of its verdict line ("admin
// ClusterPolicyEndpoint/x", "namespace PolicyEndpoint/e2e/a", "default",
// "admin node IP").
type cprobe struct {
	pod     string
	dir     string // egress, ingress
	proto   string // tcp, udp
	peer    string
	port    int
	allow   bool
	decider string
}

func (p cprobe) String() string {
	return fmt.Sprintf("%s %s %s %s/%d", p.pod, p.dir, p.peer, p.proto, p.port)
}

// srcNS is the netns a peer address is in.
func (n *clusterNode) srcNS(peer string) netns.NsHandle {
	if peer == policyNodeIP {
		return n.ns[n.Node]
	}
	return n.ns[n.peerNS()]
}

// try runs a probe as traffic: whether the answer came back.
func (n *clusterNode) try(p cprobe) bool {
	podIP := n.pods[p.pod]
	if p.dir == "egress" {
		return dialFrom(n.ns[n.podNS(p.pod)], p.proto, "", p.peer, p.port)
	}
	return dialFrom(n.srcNS(p.peer), p.proto, p.peer, podIP, p.port)
}

// dialFrom says whether a TCP connection (the server's "ok") or a UDP
// datagram (its echo) from src (empty: the route's source) in ns to
// dst:port gets its answer.
func dialFrom(ns netns.NsHandle, proto, src, dst string, port int) bool {
	var ok bool
	celltest.InNS(ns, func() error {
		d := net.Dialer{Timeout: probeTimeout}
		if src != "" {
			if proto == "udp" {
				d.LocalAddr = &net.UDPAddr{IP: net.ParseIP(src)}
			} else {
				d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
			}
		}
		c, err := d.Dial(proto+"4", net.JoinHostPort(dst, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(probeTimeout))
		want := "ok"
		if proto == "udp" {
			want = "ping"
			if _, err := c.Write([]byte(want)); err != nil {
				return err
			}
		}
		buf := make([]byte, 8)
		k, err := c.Read(buf)
		ok = err == nil && string(buf[:k]) == want
		return nil
	})
	return ok
}

// verdict is the verdict program's line for the probe's packet.
func (n *clusterNode) verdict(p cprobe) string {
	out, errOut, err := n.agent.Dbg("policy", "verdict", "--pod", n.pods[p.pod], "--direction", p.dir, "--peer", p.peer,
		"--proto", p.proto, "--port", strconv.Itoa(p.port))
	if err != nil {
		return fmt.Sprintf("enimasq-dbg policy verdict: %v: %s%s", err, out, errOut)
	}
	return strings.TrimSpace(out)
}

// verdictAgrees says whether a verdict line is the probe's: ALLOW or DENY,
// and the deciding step and object.
func (p cprobe) verdictAgrees(line string) bool {
	want := "DENY "
	if p.allow {
		want = "ALLOW "
	}
	return strings.HasPrefix(line, want) && strings.Contains(line, ": "+p.decider+": ")
}

// expect waits (up to 10 s) until the verdict program gives every probe's
// verdict and decider, then runs each probe as traffic: both must be the
// probe's.
func (n *clusterNode) expect(t *testing.T, probes ...cprobe) {
	t.Helper()
	verdicts := make([]string, len(probes))
	deadline := time.Now().Add(10 * time.Second)
	for {
		done := true
		for i, p := range probes {
			if !p.verdictAgrees(verdicts[i]) {
				verdicts[i] = n.verdict(p)
			}
			done = done && p.verdictAgrees(verdicts[i])
		}
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, p := range probes {
		if !p.verdictAgrees(verdicts[i]) {
			t.Errorf("%s: the verdict program says %q, want %s by %q", p, verdicts[i], allowText(p.allow), p.decider)
		}
		if got := n.try(p); got != p.allow {
			t.Errorf("%s: traffic passed=%t, want %t (the verdict program: %s)", p, got, p.allow, verdicts[i])
		}
	}
}

func allowText(allow bool) string {
	if allow {
		return "ALLOW"
	}
	return "DENY"
}

// probeCounts are what probe loops saw: tries, connections that passed
// though denied (leaked), and allowed ones that failed.
type probeCounts struct{ tries, leaked, failed int64 }

// probeLoops runs one loop per probe, each trying its connection again
// and again, until the returned function stops them and returns what
// they saw.
func (n *clusterNode) probeLoops(probes ...cprobe) (stop func() probeCounts) {
	var wg sync.WaitGroup
	var done atomic.Bool
	var leaked, failed, tries atomic.Int64
	for _, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				tries.Add(1)
				if got := n.try(p); got && !p.allow {
					leaked.Add(1)
				} else if !got && p.allow {
					failed.Add(1)
				}
			}
		}()
	}
	return func() probeCounts {
		done.Store(true)
		wg.Wait()
		return probeCounts{tries.Load(), leaked.Load(), failed.Load()}
	}
}
