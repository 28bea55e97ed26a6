package fqdn

import (
	"net/netip"
	"time"

	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// Settings are what the domain names take (the flags are netpolicy's:
// --tofqdns-*, as Cilium's, declared by the standalone agent only).
type Settings struct {
	// Off, when set, says why no lookup is redirected: name rules then
	// allow nothing, as the AWS agent's skipped entries.
	Off string
	// Port is the proxy's port in the node's network namespace (0: a free
	// one).
	Port uint16
	// IPv4 and IPv6 are the node's families.
	IPv4, IPv6 bool
	// MinTTL is the least time an answer's addresses are allowed for.
	MinTTL time.Duration
	// MaxIPsPerName bounds the addresses a pod holds for one name,
	// MaxNamesPerPod its names and MaxIPsPerPod its addresses: past them,
	// those that expire first go.
	MaxIPsPerName, MaxNamesPerPod, MaxIPsPerPod int
	// MaxDelay is how long an answer with new addresses may wait for the
	// kernel; past it the pod gets SERVFAIL (never an answer it cannot
	// use).
	MaxDelay time.Duration
	// StateDir holds the checkpoint of policy-fqdn.
	StateDir string
	// Mark and Table are the redirect's fwmark and routing table.
	Mark  uint32
	Table int
}

// Applied tells when the kernel holds policy-fqdn up to a revision for a
// pod: the compiler's versions of its tiers were compiled from it and are
// in force (netpolicy provides it from policy-versions).
type Applied interface {
	Applied(txn statedb.ReadTxn, pod netip.Addr, tiers []policybpf.PolicyTier, rev statedb.Revision) (bool, <-chan struct{})
}
