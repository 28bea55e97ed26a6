package test

// A container runtime's view of enimasq-cni: libcni (the library containerd
// and CRI-O use) drives the real binary, in the node's netns, against a real
// agent.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"

	"github.com/enimasq/enimasq/cells/agentapi"
)

// nsExec runs plugins in a named netns (ip netns exec), as a runtime on the
// node would run them in the host netns.
type nsExec struct {
	netns string
}

func (e *nsExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", e.netns, pluginPath)
	cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = environ, bytes.NewReader(stdin), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		// As invoke.RawExec: the plugin's error is JSON on stdout.
		cniErr := &types.Error{}
		if json.Unmarshal(stdout.Bytes(), cniErr) != nil || cniErr.Code == 0 {
			return nil, fmt.Errorf("%s: %w (stdout %q, stderr %q)", filepath.Base(pluginPath), err, stdout.String(), stderr.String())
		}
		return nil, cniErr
	}
	return stdout.Bytes(), nil
}

func (e *nsExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (e *nsExec) Decode(data []byte) (version.PluginInfo, error) {
	return (&version.PluginDecoder{}).Decode(data)
}

// libCNI is a runtime's CNI: the network list "enimasq" (CNI 1.1.0, one
// enimasq-cni plugin on the agent's socket) and libcni with a result cache.
type libCNI struct {
	t    *testing.T
	topo *vpcTopology
	cni  *libcni.CNIConfig
	list *libcni.NetworkConfigList
}

func newLibCNI(t *testing.T, topo *vpcTopology, agentSocket string) *libCNI {
	t.Helper()
	return newLibCNINetwork(t, topo, agentSocket, "enimasq")
}

// newLibCNINetwork is newLibCNI with the network list named network.
func newLibCNINetwork(t *testing.T, topo *vpcTopology, agentSocket, network string) *libCNI {
	t.Helper()
	bin := Build(t)
	list, err := libcni.NetworkConfFromBytes(fmt.Appendf(nil, `{
  "cniVersion": "1.1.0",
  "name": %q,
  "plugins": [{"type": "enimasq-cni", "agentSocket": %q, "waitSeconds": 10}]
}`, network, agentSocket))
	if err != nil {
		t.Fatal(err)
	}
	return &libCNI{
		t: t, topo: topo, list: list,
		cni: libcni.NewCNIConfigWithCacheDir([]string{filepath.Dir(bin.CNI)}, t.TempDir(), &nsExec{netns: topo.Node}),
	}
}

// withoutCache is the same runtime with an empty result cache: its GC only
// runs the plugin's GC (libcni first DELs the cached attachments that are
// not valid).
func (c *libCNI) withoutCache() *libCNI {
	out := *c
	out.cni = libcni.NewCNIConfigWithCacheDir(c.cni.Path, c.t.TempDir(), &nsExec{netns: c.topo.Node})
	return &out
}

// podRef is a pod as the kubelet names it in CNI_ARGS.
type podRef struct {
	Namespace, Name, UID string
}

// runtimeConf is the attachment (containerID, ifname) of a pod in the named
// netns podNS ("" for none).
func runtimeConf(containerID, ifname, podNS string, pod podRef) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{ContainerID: containerID, IfName: ifname}
	if podNS != "" {
		rt.NetNS = "/var/run/netns/" + podNS
	}
	args := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", pod.Namespace}, {"K8S_POD_NAME", pod.Name}}
	if pod.UID != "" {
		args = append(args, [2]string{"K8S_POD_UID", pod.UID})
	}
	rt.Args = args
	return rt
}

func (c *libCNI) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// add runs ADD and returns the pod IP.
func (c *libCNI) add(rt *libcni.RuntimeConf) (string, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	res, err := c.cni.AddNetworkList(ctx, c.list, rt)
	if err != nil {
		return "", err
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return "", err
	}
	if len(r.IPs) != 1 {
		return "", fmt.Errorf("ADD result has %d IPs: %+v", len(r.IPs), r)
	}
	return r.IPs[0].Address.IP.String(), nil
}

func (c *libCNI) mustAdd(rt *libcni.RuntimeConf) string {
	c.t.Helper()
	ip, err := c.add(rt)
	if err != nil {
		c.t.Fatalf("ADD %s/%s: %v", rt.ContainerID, rt.IfName, err)
	}
	return ip
}

func (c *libCNI) del(rt *libcni.RuntimeConf) error {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.cni.DelNetworkList(ctx, c.list, rt)
}

func (c *libCNI) mustDel(rt *libcni.RuntimeConf) {
	c.t.Helper()
	if err := c.del(rt); err != nil {
		c.t.Fatalf("DEL %s/%s: %v", rt.ContainerID, rt.IfName, err)
	}
}

func (c *libCNI) check(rt *libcni.RuntimeConf) error {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.cni.CheckNetworkList(ctx, c.list, rt)
}

func (c *libCNI) gc(valid []types.GCAttachment) error {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.cni.GCNetworkList(ctx, c.list, &libcni.GCArgs{ValidAttachments: valid})
}

func (c *libCNI) status() error {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.cni.GetStatusNetworkList(ctx, c.list)
}

// cniErrorCode is the CNI error code of err (0 when it is not a CNI error).
func cniErrorCode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// hostVethName is enimasq-cni's name of the host veth of a container's
// interface.
func hostVethName(containerID, ifname string) string {
	sum := sha256.Sum256([]byte(containerID + "\x00" + ifname))
	return "lxc" + hex.EncodeToString(sum[:])[:11]
}

// poolCiliumNode is the sample CiliumNode with a pool of n addresses
// (10.130.100.140... on ENI 1, then 10.130.112.30... on ENI 2, half each).
func poolCiliumNode(t *testing.T, n int) string {
	node := sample(t, "ciliumnode.yaml")
	start := strings.Index(node, "    pool:\n")
	end := strings.Index(node, "status:\n")
	var pool, eni1, eni2 strings.Builder
	for i := range n {
		if i%2 == 0 {
			fmt.Fprintf(&pool, "      10.130.100.%d:\n        resource: eni-0a1b2c3d4e5f00001\n", 140+i/2)
			fmt.Fprintf(&eni1, "        - 10.130.100.%d\n", 140+i/2)
		} else {
			fmt.Fprintf(&pool, "      10.130.112.%d:\n        resource: eni-0a1b2c3d4e5f00002\n", 30+i/2)
			fmt.Fprintf(&eni2, "        - 10.130.112.%d\n", 30+i/2)
		}
	}
	node = node[:start] + "    pool:\n" + pool.String() + node[end:]
	node = strings.Replace(node, "        - 10.130.100.133\n        - 10.130.100.134\n        - 10.130.100.135\n", eni1.String(), 1)
	node = strings.Replace(node, "        - 10.130.112.20\n        - 10.130.112.21\n", eni2.String(), 1)
	return node
}

// apiClient calls the agent API on its socket.
type apiClient struct{ *agentapi.Client }

func newAPIClient(socket string) *apiClient {
	return &apiClient{agentapi.NewClient(socket, 30*time.Second)}
}

// do sends body (JSON, unless nil) and decodes a 2xx answer into out; it
// returns the status code and the body.
func (c *apiClient) do(method, path string, body, out any) (int, []byte, error) {
	code, data, err := c.Send(method, path, body)
	if err != nil {
		return code, data, err
	}
	if out != nil && code < 300 {
		if err := json.Unmarshal(data, out); err != nil {
			return code, data, fmt.Errorf("%s %s: %w: %s", method, path, err, data)
		}
	}
	return code, data, nil
}

// allocationRow is one allocation as GET /v1/ipam lists it.
type allocationRow struct {
	IP          string `json:"ip"`
	Owner       string `json:"owner"`
	PodUID      string `json:"podUID"`
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
	State       string `json:"state"`
}

func (c *apiClient) list(t testing.TB, query string) []allocationRow {
	t.Helper()
	var rows []allocationRow
	code, body, err := c.do(http.MethodGet, "/v1/ipam"+query, nil, &rows)
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /v1/ipam%s: %d %v %s", query, code, err, body)
	}
	return rows
}

// podRules returns, from enimasq's ip rules (protocol 237) in the node
// netns, the pod IPs with an egress rule (priority 111, from <pod>) and
// those with an ingress rule (priority 20, to <pod>).
func (topo *vpcTopology) podRules() (from, to map[string]bool, err error) {
	h, err := netlink.NewHandleAt(topo.nodeNS)
	if err != nil {
		return nil, nil, err
	}
	defer h.Close()
	rules, err := h.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		return nil, nil, err
	}
	from, to = map[string]bool{}, map[string]bool{}
	for _, r := range rules {
		if r.Protocol != 237 {
			continue
		}
		switch {
		case r.Priority == 111 && r.Src != nil:
			from[r.Src.IP.String()] = true
		case r.Priority == 20 && r.Dst != nil:
			to[r.Dst.IP.String()] = true
		}
	}
	return from, to, nil
}

// hostRoutes returns the node's main-table routes to single addresses, by
// destination, with their link's name.
func (topo *vpcTopology) hostRoutes() map[string]string {
	topo.t.Helper()
	h, err := netlink.NewHandleAt(topo.nodeNS)
	if err != nil {
		topo.t.Fatal(err)
	}
	defer h.Close()
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		topo.t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if ones, bits := r.Dst.Mask.Size(); ones != bits {
			continue
		}
		name := fmt.Sprint(r.LinkIndex)
		if l, err := h.LinkByIndex(r.LinkIndex); err == nil {
			name = l.Attrs().Name
		}
		out[r.Dst.IP.String()] = name
	}
	return out
}
