package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// NetConf is the plugin's network configuration.
type NetConf struct {
	types.NetConf

	// AgentSocket is the enimasq-agent API socket.
	AgentSocket string `json:"agentSocket,omitempty"`
	// Family is the address family to allocate: "ipv4" (default) or "ipv6".
	Family string `json:"family,omitempty"`
	// MTU overrides the MTU taken from the pod's ENI link.
	MTU int `json:"mtu,omitempty"`
	// WaitSeconds bounds how long ADD waits for the pod's rules (default 30).
	WaitSeconds int `json:"waitSeconds,omitempty"`
}

const defaultAgentSocket = "/var/run/enimasq/enimasq.sock"

func loadConf(data []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(data, conf); err != nil {
		return nil, fmt.Errorf("network configuration: %w", err)
	}
	if conf.AgentSocket == "" {
		conf.AgentSocket = defaultAgentSocket
	}
	switch conf.Family {
	case "":
		conf.Family = "ipv4"
	case "ipv4", "ipv6":
	default:
		return nil, fmt.Errorf("network configuration: family %q: want ipv4 or ipv6", conf.Family)
	}
	if conf.MTU < 0 || conf.MTU > 65535 {
		return nil, fmt.Errorf("network configuration: mtu %d out of range", conf.MTU)
	}
	if conf.WaitSeconds <= 0 {
		conf.WaitSeconds = 30
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.NetConf); err != nil {
			return nil, fmt.Errorf("prevResult: %w", err)
		}
	}
	return conf, nil
}

// k8sArgs are the CNI_ARGS the kubelet passes.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE types.UnmarshallableString //nolint:revive // CNI_ARGS names
	K8S_POD_NAME      types.UnmarshallableString //nolint:revive
	K8S_POD_UID       types.UnmarshallableString //nolint:revive
}

// pod is what the agent is told about the pod of an attachment.
type pod struct {
	// Owner is NAMESPACE/NAME: a label of the allocation (the attachment,
	// container ID and interface name, is what holds it).
	Owner string
	// UID is K8S_POD_UID ("" when the runtime does not pass it).
	UID string
	// LegacyOwners are the owners the plugin used to give a pod without
	// Kubernetes names ("cni/<container ID>" unchanged), which a version-1
	// checkpoint may still hold: DEL and CHECK fall back to them.
	LegacyOwners []string
}

// podOf names the pod of an attachment: namespace/name from CNI_ARGS, else
// "cni/" and the container ID made a valid pod name (containerPodName).
func podOf(args *skel.CmdArgs) (pod, error) {
	var ka k8sArgs
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return pod{}, fmt.Errorf("CNI_ARGS: %w", err)
	}
	ns, name := strings.TrimSpace(string(ka.K8S_POD_NAMESPACE)), strings.TrimSpace(string(ka.K8S_POD_NAME))
	uid := strings.TrimSpace(string(ka.K8S_POD_UID))
	if ns != "" && name != "" {
		return pod{Owner: ns + "/" + name, UID: uid}, nil
	}
	name = containerPodName(args.ContainerID)
	if name == "" {
		return pod{}, fmt.Errorf("no K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS and no usable container ID (%q)", args.ContainerID)
	}
	p := pod{Owner: "cni/" + name, UID: uid}
	if legacy := "cni/" + args.ContainerID; legacy != p.Owner {
		p.LegacyOwners = []string{legacy}
	}
	return p, nil
}

// maxPodName is the longest Kubernetes object name (a DNS-1123 subdomain).
const maxPodName = 253

// containerPodName makes a pod name of a container ID for a pod outside
// Kubernetes: lower case, every character other than a letter or a digit
// turned into '-', no '-' at either end, at most 253 characters (a
// DNS-1123 subdomain, which the agent requires). The container IDs of
// containerd and CRI-O (64 hex digits) stay as they are. Two IDs may map
// to one name: the owner only labels the allocation, the attachment holds
// it.
func containerPodName(containerID string) string {
	b := []byte(strings.ToLower(containerID))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			b[i] = '-'
		}
	}
	name := strings.Trim(string(b), "-")
	if len(name) > maxPodName {
		name = strings.TrimRight(name[:maxPodName], "-")
	}
	return name
}
