package ipam

import "github.com/vishvananda/netns"

// KernelChanges is the kernel's NetlinkChanges in ns, for tests that hold
// the fake's notifications against the kernel's.
func KernelChanges(ns *netns.NsHandle) NetlinkChanges { return kernelChanges{ns: ns} }
