package agenttest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/enimasq/enimasq/test/k8stest"
)

// The simulated EC2 instance: a node network namespace whose ENIs are veths
// with the MACs of the CiliumNode's status.eni.enis, their peers in a "vpc"
// namespace that holds each subnet's gateway and the instance metadata
// service (169.254.169.254), which Cilium's ENI mode asks for the
// instance, its type, its MAC, VPC and subnet.

const (
	instanceID   = "i-0e1a2b3c4d5e6f708"
	instanceType = "m5.large"
	vpcID        = "vpc-0a1b2c3d4e5f60718"
	zone         = "us-east-1a"
	imdsAddr     = "169.254.169.254"
)

var vpcCIDR = netip.MustParsePrefix("10.200.0.0/16")

// eni is an ENI of the node: eth<number> in the node namespace.
type eni struct {
	id        string
	number    int
	mac       string
	subnetID  string
	subnet    netip.Prefix
	primary   netip.Addr
	addresses []netip.Addr // secondary IPs, the pool
}

func (e eni) link() string            { return fmt.Sprintf("eth%d", e.number) }
func (e eni) gateway() netip.Addr     { return e.subnet.Addr().Next() }
func (e eni) routeTable() int         { return 10 + e.number }
func (e eni) holds(a netip.Addr) bool { return a == e.primary || contains(e.addresses, a) }

func contains(as []netip.Addr, a netip.Addr) bool {
	for _, x := range as {
		if x == a {
			return true
		}
	}
	return false
}

func addrRange(first string, n int) []netip.Addr {
	a := netip.MustParseAddr(first)
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = a
		a = a.Next()
	}
	return out
}

// The node: ENI 0 carries the node IP (below first-interface-index 1: no
// pod IPs); ENI 1 hands out the pod, router and health IPs.
var (
	eni0 = eni{id: "eni-0a000000000000010", number: 0, mac: "0a:00:00:c8:00:0a", subnetID: "subnet-0a00000000000000a",
		subnet: netip.MustParsePrefix("10.200.0.0/24"), primary: netip.MustParseAddr("10.200.0.10")}
	eni1 = eni{id: "eni-0a000000000000011", number: 1, mac: "0a:00:00:c8:10:0a", subnetID: "subnet-0a00000000000000b",
		subnet: netip.MustParsePrefix("10.200.16.0/24"), primary: netip.MustParseAddr("10.200.16.10"),
		addresses: addrRange("10.200.16.11", 120)}
	enis     = []eni{eni0, eni1}
	nodeName = "ip-10-200-0-10.ec2.internal"
)

// node is the simulated instance.
type node struct {
	name    string // of the node network namespace
	vpc     string // of the vpc network namespace
	handle  *netlink.Handle
	imdsLog *strings.Builder
	imdsMu  sync.Mutex
}

func randomSuffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// addNetNS creates a named network namespace (/run/netns/NAME), deleted at
// cleanup.
func addNetNS(t testing.TB, name string) netns.NsHandle {
	t.Helper()
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func newNode(t testing.TB) *node {
	t.Helper()
	suffix := randomSuffix()
	n := &node{name: "enimasq-node-" + suffix, vpc: "enimasq-vpc-" + suffix, imdsLog: &strings.Builder{}}
	nodeNS := addNetNS(t, n.name)
	vpcNS := addNetNS(t, n.vpc)
	h, err := netlink.NewHandleAt(nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	n.handle = h
	vh, err := netlink.NewHandleAt(vpcNS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vh.Close() })

	must := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %s", what, err)
		}
	}
	lo, err := h.LinkByName("lo")
	must(err, "lo")
	must(h.LinkSetUp(lo), "lo up")
	vlo, err := vh.LinkByName("lo")
	must(err, "vpc lo")
	must(vh.LinkSetUp(vlo), "vpc lo up")

	for _, e := range enis {
		mac, _ := net.ParseMAC(e.mac)
		peer := fmt.Sprintf("vpc%d", e.number)
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: e.link(), HardwareAddr: mac, MTU: 9001},
			PeerName: peer, PeerNamespace: netlink.NsFd(int(vpcNS))}
		must(h.LinkAdd(veth), "veth "+e.link())
		pl, err := vh.LinkByName(peer)
		must(err, peer)
		must(vh.LinkSetUp(pl), peer+" up")
		gw := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(e.gateway(), e.subnet.Bits()))}
		must(vh.AddrAdd(pl, gw), "gateway "+e.gateway().String())
	}
	// eth0 is the node's: its primary IP, the default route via its
	// gateway, and the metadata service behind it, as on EC2.
	eth0, err := h.LinkByName(eni0.link())
	must(err, "eth0")
	must(h.AddrAdd(eth0, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(eni0.primary, eni0.subnet.Bits()))}), "eth0 address")
	must(h.LinkSetUp(eth0), "eth0 up")
	must(h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: eni0.gateway().AsSlice()}), "default route")

	vpc0, err := vh.LinkByName("vpc0")
	must(err, "vpc0")
	must(vh.AddrAdd(vpc0, &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix(imdsAddr + "/32"))}), "metadata address")
	n.serveMetadata(t, vpcNS)
	return n
}

// serveMetadata serves the instance metadata (IMDSv2) on
// 169.254.169.254:80 in the vpc namespace: the listening socket is made on
// a thread in that namespace and stays there.
func (n *node) serveMetadata(t testing.TB, ns netns.NsHandle) {
	t.Helper()
	l, err := k8stest.ListenIn(ns, imdsAddr+":80")
	if err != nil {
		t.Fatalf("metadata service: %s", err)
	}
	meta := map[string]string{
		"instance-id":                 instanceID,
		"instance-type":               instanceType,
		"mac":                         eni0.mac,
		"placement/availability-zone": zone,
		"placement/region":            "us-east-1",
		"local-ipv4":                  eni0.primary.String(),
		"hostname":                    nodeName,
	}
	for _, e := range enis {
		meta["network/interfaces/macs/"+e.mac+"/vpc-id"] = vpcID
		meta["network/interfaces/macs/"+e.mac+"/subnet-id"] = e.subnetID
		meta["network/interfaces/macs/"+e.mac+"/interface-id"] = e.id
	}
	const token = "enimasq-test-token"
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /latest/api/token", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", r.Header.Get("X-Aws-Ec2-Metadata-Token-Ttl-Seconds"))
		fmt.Fprint(w, token)
	})
	mux.HandleFunc("GET /latest/meta-data/{path...}", func(w http.ResponseWriter, r *http.Request) {
		path := r.PathValue("path")
		v, ok := meta[path]
		n.imdsMu.Lock()
		fmt.Fprintf(n.imdsLog, "GET %s -> %t\n", path, ok)
		n.imdsMu.Unlock()
		if !ok || r.Header.Get("X-Aws-Ec2-Metadata-Token") != token {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, v)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
}

// objects are the Node and the CiliumNode as the kubelet and Cilium's
// operator write them for this instance: the ENIs with their addresses in
// status.eni, the pool in spec.ipam.pool.
func objects() []*unstructured.Unstructured {
	enisStatus := map[string]any{}
	pool := map[string]any{}
	for _, e := range enis {
		addrs := []any{}
		for _, a := range e.addresses {
			addrs = append(addrs, a.String())
			pool[a.String()] = map[string]any{"resource": e.id}
		}
		st := map[string]any{
			"id": e.id, "mac": e.mac, "ip": e.primary.String(),
			"subnet":            map[string]any{"id": e.subnetID, "cidr": e.subnet.String()},
			"vpc":               map[string]any{"id": vpcID, "primary-cidr": vpcCIDR.String()},
			"availability-zone": zone,
			"addresses":         addrs,
			"security-groups":   []any{"sg-0a1b2c3d4e5f60718"},
		}
		if e.number != 0 { // the operator writes the number with omitempty
			st["number"] = int64(e.number)
		}
		enisStatus[e.id] = st
	}
	k8sNode := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": nodeName, "labels": map[string]any{
			"kubernetes.io/hostname":           nodeName,
			"node.kubernetes.io/instance-type": instanceType,
			"topology.kubernetes.io/zone":      zone,
		}},
		"spec": map[string]any{"providerID": "aws:///" + zone + "/" + instanceID},
		"status": map[string]any{"addresses": []any{
			map[string]any{"type": "InternalIP", "address": eni0.primary.String()},
			map[string]any{"type": "Hostname", "address": nodeName},
		}},
	}}
	ciliumNode := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
		"metadata": map[string]any{"name": nodeName},
		"spec": map[string]any{
			"instance-id": instanceID,
			"eni": map[string]any{
				"instance-type": instanceType, "vpc-id": vpcID, "availability-zone": zone,
				"first-interface-index": int64(1), "node-subnet-id": eni0.subnetID,
			},
			"ipam": map[string]any{"pool": pool},
		},
		"status": map[string]any{"eni": map[string]any{"enis": enisStatus}},
	}}
	return []*unstructured.Unstructured{k8sNode, ciliumNode}
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %s\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
