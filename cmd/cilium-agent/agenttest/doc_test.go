// Package agenttest starts the whole of Cilium v1.20.2's agent with
// enimasq's cells (bin/cilium-agent, make cilium-agent) as a user starts it:
// in a network namespace that stands for an EC2 instance (veth ENIs, a
// metadata service behind eth0), against a real kube-apiserver with Cilium's
// CRDs, a Node and a CiliumNode as the kubelet and Cilium's operator write
// them, pods added and deleted with Cilium's own cilium-cni, state read with
// Cilium's own cilium-dbg and from the kernel.
package agenttest
