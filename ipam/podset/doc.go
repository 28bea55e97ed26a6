// Package podset is the writer of ipam-allocations when an embedding agent's
// IPAM allocates (the Cilium build): the agent's glue (ciliumlink) says
// which IPs it configured, and to whom, through Writer; each goes on the ENI
// whose addresses hold it, as Cilium places it.
package podset
