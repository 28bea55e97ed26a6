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
}

// owner names the pod for the allocator: namespace/name from CNI_ARGS, else
// the container ID.
func owner(args *skel.CmdArgs) (string, error) {
	var ka k8sArgs
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return "", fmt.Errorf("CNI_ARGS: %w", err)
	}
	ns, name := strings.TrimSpace(string(ka.K8S_POD_NAMESPACE)), strings.TrimSpace(string(ka.K8S_POD_NAME))
	if ns != "" && name != "" {
		return ns + "/" + name, nil
	}
	if args.ContainerID == "" || strings.ContainsAny(args.ContainerID, "/ ") {
		return "", fmt.Errorf("no K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS and no usable container ID (%q)", args.ContainerID)
	}
	// The allocator wants NAMESPACE/POD: a pod outside Kubernetes is
	// "cni/<container ID>".
	return "cni/" + args.ContainerID, nil
}
