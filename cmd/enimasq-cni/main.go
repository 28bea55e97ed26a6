// Command enimasq-cni is the CNI plugin of enimasq: it asks the agent for a
// pod IP from the node's ENIs (the agent programs the pod's ip rules) and
// wires the pod with a veth pair, as Cilium's plugin does in ENI mode.
//
// The agent holds each IP for an attachment (CNI_CONTAINERID and
// CNI_IFNAME), labelled with the pod (K8S_POD_NAMESPACE/K8S_POD_NAME and
// K8S_POD_UID). ADD allocates through the agent socket and waits until the
// pod's rules are in the kernel, then creates the veth pair (host side
// lxc<hash>, pod side eth0), gives eth0 the pod IP as /32 with a default
// route via the host side, and adds the host route to the pod. DEL removes
// the veth and releases the attachment's IPs only; it succeeds when there is
// nothing to remove. CHECK verifies the attachment's allocation, interface,
// address, route and rules. GC (CNI 1.1) releases the attachments not in
// cni.dev/valid-attachments and removes their veths. STATUS says whether the
// agent answers.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
)

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    cmdAdd,
		Del:    cmdDel,
		Check:  cmdCheck,
		GC:     cmdGC,
		Status: cmdStatus,
	}, version.All, "enimasq-cni: pod networking from the enimasq ENI IPAM")
}
