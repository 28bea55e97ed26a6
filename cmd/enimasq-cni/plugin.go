package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"time"

	"go4.org/netipx"

	"github.com/enimasq/enimasq/cells/agentapi"
	"github.com/enimasq/enimasq/ipam/ipamapi"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// The pod's gateway is a link-local address answered by a static neighbor
// entry for the host side of the veth: the pod needs no address of the node.
var (
	podGatewayV4 = netip.MustParseAddr("169.254.1.1")
	podGatewayV6 = netip.MustParseAddr("fe80::1")
)

// hostVethName is "lxc" and a short hash of the attachment's container ID
// and interface name (at most 15 characters, the kernel's limit): two
// interfaces of one container are two veths. The network is not in it: an
// interface name is the container's own, whatever network it is in.
func hostVethName(att ipamapi.Attachment) string {
	sum := sha256.Sum256([]byte(att.ContainerID + "\x00" + att.IfName))
	return "lxc" + hex.EncodeToString(sum[:])[:11]
}

// legacyHostVethName is the host veth's name for an attachment recorded
// without a network (checkpoint version 2), made when it was named after
// the container ID alone.
func legacyHostVethName(containerID string) string {
	sum := sha256.Sum256([]byte(containerID))
	return "lxc" + hex.EncodeToString(sum[:])[:11]
}

func gatewayFor(addr netip.Addr) netip.Addr {
	if addr.Is4() {
		return podGatewayV4
	}
	return podGatewayV6
}

// hostPrefix is addr's host route prefix (/32, /128) for netlink.
func hostPrefix(addr netip.Addr) *net.IPNet {
	return netipx.PrefixIPNet(netip.PrefixFrom(addr, addr.BitLen()))
}

// netConf is the prologue of every command: the network configuration.
func netConf(args *skel.CmdArgs) (*NetConf, error) {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "enimasq-cni: bad network configuration", err.Error())
	}
	return conf, nil
}

// setup is the prologue of the commands on an attachment (ADD, DEL,
// CHECK): the network configuration, the attachment and its pod.
func setup(args *skel.CmdArgs) (*NetConf, ipamapi.Attachment, pod, error) {
	conf, err := netConf(args)
	if err != nil {
		return nil, ipamapi.Attachment{}, pod{}, err
	}
	p, err := podOf(args)
	if err != nil {
		return nil, ipamapi.Attachment{}, pod{}, types.NewError(types.ErrInvalidEnvironmentVariables, "enimasq-cni: cannot name the pod", err.Error())
	}
	return conf, ipamapi.Attachment{Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName}, p, nil
}

// agentError is a failed call to the agent as a CNI error: "try again
// later" (11) when the agent is not running, or not ready (restoring its
// checkpoint, reading its CiliumNode).
func agentError(msg string, err error) error {
	if errors.As(err, new(*agentapi.NotRunningError)) {
		return types.NewError(types.ErrTryAgainLater, "enimasq-cni: "+err.Error(), msg)
	}
	if e := (*agentapi.APIError)(nil); errors.As(err, &e) && e.Body.Reason == "not-ready" {
		return types.NewError(types.ErrTryAgainLater, "enimasq-cni: "+msg, err.Error())
	}
	return types.NewError(types.ErrInternal, "enimasq-cni: "+msg, err.Error())
}

// secondaryRouteMetric is the metric base of the routes of a pod's second
// and further interfaces (plus the interface's index).
const secondaryRouteMetric = 100

// The CNI 1.1 STATUS error codes, which containernetworking/cni v1.3.0 (the
// version Cilium v1.20.2 pins) does not name yet: 50 "the plugin is not
// available" (cannot service ADD requests), 51 "the plugin is not able to
// allocate new IP addresses".
const (
	errPluginNotAvailable uint = 50
	errNoIPsAvailable     uint = 51
)

// cmdStatus answers whether an ADD would work now, as the agent's state
// says: the agent running and ready to allocate (its checkpoint, CiliumNode
// and ip-masq-agent CIDRs loaded) with a free IP of the family. A module
// that is Degraded while the last good state is in force (an invalid
// ip-masq-agent file) does not stop ADDs and does not fail STATUS.
func cmdStatus(args *skel.CmdArgs) error {
	conf, err := netConf(args)
	if err != nil {
		return err
	}
	err = newAgentClient(conf.AgentSocket, 5*time.Second).canAllocate(conf.Family)
	var e *agentapi.APIError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &e) && e.Body.Reason == "pool-exhausted":
		return types.NewError(errNoIPsAvailable, "enimasq-cni: "+e.Body.Message, "")
	}
	return types.NewError(errPluginNotAvailable, "enimasq-cni: "+err.Error(), "")
}
