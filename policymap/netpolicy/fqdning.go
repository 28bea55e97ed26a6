package netpolicy

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/netpolicy/compile"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
	"github.com/enimasq/enimasq/policymap/netpolicy/fqdn"
)

// FQDNCell enforces the name rules (package fqdn), fed from the objects'
// tables and told by policy-versions when an answer is in the kernel: the
// domain-name flags, policy-fqdn and the part. The standalone agent has
// it; linked into Cilium, Cilium declares the --tofqdns-* flags for its own
// FQDN policy, and enimasq has no table or proxy there (name rules allow
// nothing, as the AWS agent's skipped entries).
var FQDNCell = cell.Module("fqdn", "Domain names of network policy",
	cell.Config(DefaultFQDNConfig),
	endpoints.DNSNamesCell,
	cell.ProvidePrivate(newFQDNSettings, appliedFromVersions),
	fqdn.Cell,
)

// FQDNConfig holds the domain-name flags, Cilium's --tofqdns-* where
// Cilium has one (with its meaning), declared by the standalone agent
// (FQDNCell).
type FQDNConfig struct {
	EnablePolicyFQDN     bool          `mapstructure:"enable-policy-fqdn"`
	ToFQDNsProxyPort     uint16        `mapstructure:"tofqdns-proxy-port"`
	ToFQDNsMinTTL        int           `mapstructure:"tofqdns-min-ttl"`
	ToFQDNsMaxIPsPerHost int           `mapstructure:"tofqdns-endpoint-max-ip-per-hostname"`
	PolicyFQDNMaxNames   int           `mapstructure:"policy-fqdn-max-names-per-pod"`
	PolicyFQDNMaxIPs     int           `mapstructure:"policy-fqdn-max-ips-per-pod"`
	ToFQDNsProxyMaxDelay time.Duration `mapstructure:"tofqdns-proxy-response-max-delay"`
}

// DefaultFQDNConfig: on wherever network policy is; Cilium's defaults
// where it has the flag, but the delay (see the flag).
var DefaultFQDNConfig = FQDNConfig{
	EnablePolicyFQDN:     true,
	ToFQDNsProxyPort:     0,
	ToFQDNsMinTTL:        0,
	ToFQDNsMaxIPsPerHost: 1000,
	PolicyFQDNMaxNames:   1024,
	PolicyFQDNMaxIPs:     1024,
	ToFQDNsProxyMaxDelay: time.Second,
}

func (def FQDNConfig) Flags(flags *pflag.FlagSet) {
	flags.Bool("enable-policy-fqdn", def.EnablePolicyFQDN, "Enforce the domainName entries of PolicyEndpoints and ClusterPolicyEndpoints (ApplicationNetworkPolicy and ClusterNetworkPolicy domainNames): the DNS lookups of the pods they select go through a DNS proxy on the node, and the addresses of the answers are allowed for their TTL. Off, such an entry allows nothing (as the AWS agent skips it)")
	flags.Uint16("tofqdns-proxy-port", def.ToFQDNsProxyPort, "The DNS proxy's port on the node, UDP and TCP (0: a free one)")
	flags.Int("tofqdns-min-ttl", def.ToFQDNsMinTTL, "The least time, in seconds, an answer's addresses stay allowed, whatever its TTL (0: the TTL)")
	flags.Int("tofqdns-endpoint-max-ip-per-hostname", def.ToFQDNsMaxIPsPerHost, "The most addresses a pod holds for one name; past it the first to expire go (enimasq_policy_fqdn_ips_dropped_total)")
	flags.Int("policy-fqdn-max-names-per-pod", def.PolicyFQDNMaxNames, "The most names a pod holds addresses for; past it the name whose addresses expire first goes (enimasq_policy_fqdn_ips_dropped_total)")
	flags.Int("policy-fqdn-max-ips-per-pod", def.PolicyFQDNMaxIPs, "The most addresses a pod holds for all its names (each is a key of the pod in the node's shared policy map: one pod's lookups must not fill it); past it the names whose addresses expire first go (enimasq_policy_fqdn_ips_dropped_total)")
	flags.Duration("tofqdns-proxy-response-max-delay", def.ToFQDNsProxyMaxDelay, "How long an answer with new addresses waits for them to be in the kernel; past it the pod gets SERVFAIL (Cilium sends the answer then; enimasq never gives a pod an answer its policy cannot use yet)")
}

// The redirect's fwmark and routing table: a mark bit and a table no
// other agent of the node uses (Cilium's are 0x200 and 2004/2005 for its
// own proxy; enimasq runs its proxy only where Cilium does not).
const (
	fqdnMark  = 0x4000_0000
	fqdnTable = 2055
)

type fqdnParams struct {
	cell.In

	Policy PolicyConfig
	FQDN   FQDNConfig
	Node   nodeconfig.Config
	Maps   policymap.MapsParams
}

// newFQDNSettings: names are enforced with network policy on kernel maps,
// standalone, unless --enable-policy-fqdn=false.
func newFQDNSettings(p fqdnParams) (fqdn.Settings, error) {
	c := p.FQDN
	s := fqdn.Settings{
		Port: c.ToFQDNsProxyPort, IPv4: p.Node.EnableIPv4, IPv6: p.Node.EnableIPv6,
		MinTTL: time.Duration(c.ToFQDNsMinTTL) * time.Second, MaxIPsPerName: c.ToFQDNsMaxIPsPerHost, MaxNamesPerPod: c.PolicyFQDNMaxNames, MaxIPsPerPod: c.PolicyFQDNMaxIPs,
		MaxDelay: c.ToFQDNsProxyMaxDelay, Mark: fqdnMark, Table: fqdnTable, StateDir: p.Node.StateDir,
	}
	switch {
	case !p.Policy.EnableNetworkPolicy:
		s.Off = "network policy is disabled"
	case !c.EnablePolicyFQDN:
		s.Off = "--enable-policy-fqdn=false"
	case p.Maps.Store != nil:
		if _, kernel := p.Maps.Store.(bpf.KernelStore); !kernel {
			s.Off = "the policy maps are not kernel maps"
		}
	}
	if s.Off != "" {
		return s, nil
	}
	switch {
	case c.ToFQDNsMinTTL < 0:
		return s, fmt.Errorf("--tofqdns-min-ttl %d: must not be negative", c.ToFQDNsMinTTL)
	case c.ToFQDNsMaxIPsPerHost < 1:
		return s, fmt.Errorf("--tofqdns-endpoint-max-ip-per-hostname %d: must be at least 1", c.ToFQDNsMaxIPsPerHost)
	case c.PolicyFQDNMaxNames < 1:
		return s, fmt.Errorf("--policy-fqdn-max-names-per-pod %d: must be at least 1", c.PolicyFQDNMaxNames)
	case c.PolicyFQDNMaxIPs < c.ToFQDNsMaxIPsPerHost:
		return s, fmt.Errorf("--policy-fqdn-max-ips-per-pod %d: must be at least --tofqdns-endpoint-max-ip-per-hostname (%d)", c.PolicyFQDNMaxIPs, c.ToFQDNsMaxIPsPerHost)
	case c.ToFQDNsProxyMaxDelay <= 0:
		return s, fmt.Errorf("--tofqdns-proxy-response-max-delay %s: must be positive", c.ToFQDNsProxyMaxDelay)
	}
	return s, nil
}

// appliedFromVersions tells fqdn when an answer is in the kernel: the
// pod's versions of every tier asked were compiled from policy-fqdn at
// the revision or later (TierVersions.Names), the newest is in force
// (Active is Want, none failed, every row of it in the kernel: not
// Editing) and the row is in the kernel (Done).
func appliedFromVersions(versions statedb.Table[*compile.PodVersions]) fqdn.Applied {
	return appliedFunc(func(txn statedb.ReadTxn, pod netip.Addr, tiers []policybpf.PolicyTier, rev statedb.Revision) (bool, <-chan struct{}) {
		row, _, watch, ok := versions.GetWatch(txn, compile.PodVersionsIndex.Query(pod))
		if !ok {
			return false, watch
		}
		if k := row.Status.Kind; k != reconciler.StatusKindDone && k != reconciler.StatusKindRefreshing {
			return false, watch
		}
		for _, t := range tiers {
			tv := row.Tiers[t]
			if tv.Names < rev || tv.Active != tv.Want || tv.Failed != "" || tv.Editing {
				return false, watch
			}
		}
		return true, watch
	})
}

type appliedFunc func(statedb.ReadTxn, netip.Addr, []policybpf.PolicyTier, statedb.Revision) (bool, <-chan struct{})

func (f appliedFunc) Applied(txn statedb.ReadTxn, pod netip.Addr, tiers []policybpf.PolicyTier, rev statedb.Revision) (bool, <-chan struct{}) {
	return f(txn, pod, tiers, rev)
}
