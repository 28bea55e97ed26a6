package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/enimasq/enimasq/cells/nldump"
	"github.com/enimasq/enimasq/ipam/ipamapi"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func cmdAdd(args *skel.CmdArgs) error {
	conf, att, p, err := setup(args)
	if err != nil {
		return err
	}
	agent := newAgentClient(conf.AgentSocket, time.Duration(conf.WaitSeconds+5)*time.Second)
	alloc, created, err := agent.allocate(ipamapi.Request{
		Owner: p.Owner, PodUID: p.UID, Network: att.Network, ContainerID: att.ContainerID, IfName: att.IfName, Family: conf.Family,
	}, conf.WaitSeconds)
	if err != nil {
		return agentError("allocation for "+p.Owner+" failed", err)
	}

	// From here on, a failure undoes what this call made, and only that: a
	// retried ADD of a working pod must not tear it down.
	hostName := hostVethName(att)
	done, vethMade := false, false
	defer func() {
		if done {
			return
		}
		if vethMade {
			ip.DelLinkByName(hostName)
		}
		if created {
			agent.release(alloc.IP)
		}
	}()

	result, err := wirePod(args, conf, alloc, hostName, &vethMade, agent)
	if err != nil {
		return types.NewError(types.ErrInternal, "enimasq-cni: wiring pod "+p.Owner, err.Error())
	}
	done = true
	return types.PrintResult(result, conf.CNIVersion)
}

// wirePod creates the veth pair, addresses and routes for an allocation.
// The pod gets its address only once the agent's policy programs are on
// its device (when the agent enforces network policy on it): no packet
// reaches the pod before they judge it.
func wirePod(args *skel.CmdArgs, conf *NetConf, alloc *ipamapi.AllocationResult, hostName string, vethMade *bool,
	agent *agentClient,
) (*current.Result, error) {
	podIP, err := netip.ParseAddr(alloc.IP)
	if err != nil {
		return nil, fmt.Errorf("agent returned IP %q: %w", alloc.IP, err)
	}
	gw := gatewayFor(podIP)
	mtu := conf.MTU
	if mtu == 0 {
		if mtu, err = eniMTU(alloc.MasterMAC); err != nil {
			return nil, err
		}
	}
	if podIP.Is4() {
		err = ip.EnableIP4Forward()
	} else {
		err = ip.EnableIP6Forward()
	}
	if err != nil {
		return nil, fmt.Errorf("enable forwarding: %w", err)
	}

	podNS, err := ns.GetNS(args.Netns)
	if err != nil {
		return nil, fmt.Errorf("pod netns %s: %w", args.Netns, err)
	}
	defer podNS.Close()

	hostNS, err := ns.GetCurrentNS()
	if err != nil {
		return nil, err
	}
	defer hostNS.Close()

	var hostIf, podIf net.Interface
	err = podNS.Do(func(ns.NetNS) error {
		var err error
		hostIf, podIf, err = ip.SetupVethWithName(args.IfName, hostName, mtu, "", hostNS)
		if err != nil {
			return fmt.Errorf("veth %s/%s: %w", hostName, args.IfName, err)
		}
		*vethMade = true
		return configurePodSide(args.IfName, gw, hostIf.HardwareAddr)
	})
	if err != nil {
		return nil, err
	}

	host, err := nldump.LinkByName(hostName)
	if err != nil {
		return nil, fmt.Errorf("host veth %s: %w", hostName, err)
	}
	if err := netlink.RouteReplace(&netlink.Route{
		LinkIndex: host.Attrs().Index,
		Dst:       hostPrefix(podIP),
		Scope:     netlink.SCOPE_LINK,
	}); err != nil {
		return nil, fmt.Errorf("route to pod %s via %s: %w", podIP, hostName, err)
	}
	if err := agent.waitPolicy(hostName, podIP, conf.WaitSeconds); err != nil {
		return nil, fmt.Errorf("network policy on %s: %w", hostName, err)
	}
	if err := podNS.Do(func(ns.NetNS) error { return addPodAddress(args.IfName, podIP) }); err != nil {
		return nil, err
	}

	defaultDst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
	if podIP.Is6() {
		defaultDst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	return &current.Result{
		CNIVersion: conf.CNIVersion,
		Interfaces: []*current.Interface{
			{Name: hostIf.Name, Mac: hostIf.HardwareAddr.String()},
			{Name: podIf.Name, Mac: podIf.HardwareAddr.String(), Sandbox: args.Netns, Mtu: mtu},
		},
		IPs: []*current.IPConfig{{
			Address:   *hostPrefix(podIP),
			Gateway:   gw.AsSlice(),
			Interface: current.Int(1),
		}},
		Routes: []*types.Route{{Dst: *defaultDst, GW: gw.AsSlice()}},
	}, nil
}

// configurePodSide runs in the pod's netns: a route to the gateway, the
// default route, and a permanent neighbor entry for the gateway. The
// address comes last (addPodAddress), once the policy programs are on.
func configurePodSide(ifName string, gw netip.Addr, hostMAC net.HardwareAddr) error {
	link, err := nldump.LinkByName(ifName)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", ifName, err)
	}
	// Another interface of the pod (its first) may hold the routes to the
	// gateway and the default route: this interface's come after them, at
	// a metric of their own, so both interfaces work and the first stays
	// the pod's way out.
	addRoute := func(r *netlink.Route) error {
		err := netlink.RouteAdd(r)
		if errors.Is(err, unix.EEXIST) {
			r.Priority = secondaryRouteMetric + link.Attrs().Index
			err = netlink.RouteAdd(r)
		}
		return err
	}
	if err := addRoute(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: hostPrefix(gw), Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("route to gateway %s: %w", gw, err)
	}
	if err := addRoute(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
		return fmt.Errorf("default route via %s: %w", gw, err)
	}
	family := netlink.FAMILY_V4
	if gw.Is6() {
		family = netlink.FAMILY_V6
	}
	if err := netlink.NeighSet(&netlink.Neigh{
		LinkIndex:    link.Attrs().Index,
		Family:       family,
		State:        netlink.NUD_PERMANENT,
		IP:           gw.AsSlice(),
		HardwareAddr: hostMAC,
	}); err != nil {
		return fmt.Errorf("neighbor %s: %w", gw, err)
	}
	return nil
}

// addPodAddress runs in the pod's netns: the pod's address on its interface.
func addPodAddress(ifName string, podIP netip.Addr) error {
	link, err := nldump.LinkByName(ifName)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: hostPrefix(podIP)}); err != nil {
		return fmt.Errorf("address %s on %s: %w", podIP, ifName, err)
	}
	return nil
}

// eniMTU is the MTU of the node's ENI link with this MAC. (nldump retries
// dumps that concurrent link changes interrupt, as happens when many pods
// are set up at once.)
func eniMTU(mac string) (int, error) {
	want, err := net.ParseMAC(mac)
	if err != nil {
		return 0, fmt.Errorf("agent returned master-mac %q: %w", mac, err)
	}
	links, err := nldump.Links()
	if err != nil {
		return 0, err
	}
	for _, l := range links {
		if l.Attrs().HardwareAddr.String() == want.String() {
			return l.Attrs().MTU, nil
		}
	}
	return 0, fmt.Errorf("no ENI link with MAC %s on the node (set \"mtu\" in the network configuration to skip this)", want)
}
