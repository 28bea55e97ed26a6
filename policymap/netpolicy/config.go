package netpolicy

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/policymap/netpolicy/compile"
	"github.com/enimasq/enimasq/policymap/netpolicy/enforce"
	"github.com/enimasq/enimasq/policymap/netpolicy/source"
)

// PolicyConfig holds the network-policy flags: where the PolicyEndpoint
// objects come from and how large the policy maps are. The reconciliation
// flags (retries, refresh) are Config's, shared with the ipmasq maps.
type PolicyConfig struct {
	EnableNetworkPolicy           bool          `mapstructure:"enable-network-policy"`
	PolicyEndpointsPath           string        `mapstructure:"policy-endpoints-path"`
	PolicyMapMaxEntries           uint32        `mapstructure:"policy-map-max-entries"`
	PolicyConntrackMax            uint32        `mapstructure:"policy-conntrack-max"`
	PolicyEndpointsResyncInterval time.Duration `mapstructure:"policy-endpoints-resync-interval"`
	EnforcingMode                 string        `mapstructure:"network-policy-enforcing-mode"`
	Attach                        string        `mapstructure:"network-policy-attach"`
	AttachCheckInterval           time.Duration `mapstructure:"network-policy-attach-check-interval"`
	PolicyEventLogs               bool          `mapstructure:"policy-event-logs"`
}

// DefaultPolicyConfig has network policy off.
var DefaultPolicyConfig = PolicyConfig{
	EnableNetworkPolicy:           false,
	PolicyEndpointsPath:           "",
	PolicyMapMaxEntries:           policybpf.PolicyDefaultMaxEntries,
	PolicyConntrackMax:            policybpf.PolicyDefaultConntrackMax,
	PolicyEndpointsResyncInterval: 60 * time.Second,
	EnforcingMode:                 "standard",
	Attach:                        enforce.AttachAuto,
	AttachCheckInterval:           time.Second,
	PolicyEventLogs:               false,
}

// maxPolicyMapEntries bounds --policy-map-max-entries: each entry of a full
// map costs about 400 bytes of kernel memory.
const maxPolicyMapEntries = 1 << 22

// The bounds of --policy-conntrack-max: an LRU hash is shared out among
// the CPUs, so a small one evicts early; the largest is 512 MiB.
const (
	minConntrack = 64
	maxConntrack = 1 << 22
)

func (def PolicyConfig) Flags(flags *pflag.FlagSet) {
	flags.Bool("enable-network-policy", def.EnableNetworkPolicy, "Program the per-pod network-policy maps from the PolicyEndpoint objects: from the Kubernetes API server when it is enabled, else from --policy-endpoints-path")
	flags.String("policy-endpoints-path", def.PolicyEndpointsPath, "Directory of PolicyEndpoint files (networking.k8s.aws/v1alpha1, YAML or JSON, several documents or a List per file); it is watched. Not allowed with the Kubernetes API server, which is then the source")
	flags.Uint32("policy-map-max-entries", def.PolicyMapMaxEntries, "Size of each network-policy map (enimasq_egress_v4/_v6, enimasq_ingress_v4/_v6, the cluster maps and the chunk maps). An edit in place (a peer replaced, a port changed) needs room for the keys it adds only; a change that needs a new version holds the keys of each pod it changes twice until the new version is in: size it for the entries in use plus the new versions of the pods one such change touches (twice the entries in use for a policy that selects every pod, i.e. enimasq_bpf_map_pressure below 0.5); with less room such changes are written one pod after another (the largest pod's new version must fit beside the entries in use). A restart with another size resizes the maps with their entries")
	flags.Uint32("policy-conntrack-max", def.PolicyConntrackMax, fmt.Sprintf("Connections the policy programs track for the node (enimasq_policy_ct, an LRU hash of %d bytes of kernel memory a connection: the default is 64 MiB, as the AWS agent's conntrack-cache-table-size); when it is full the least recently used goes, and its next packets are judged by the policy again. A change of size starts the table afresh", policybpf.PolicyConntrackEntryBytes))
	flags.Duration("policy-endpoints-resync-interval", def.PolicyEndpointsResyncInterval, "Re-read the PolicyEndpoint directory this often, in case a file event was missed (with the API server: re-check the node's addresses this often)")
	flags.String("network-policy-enforcing-mode", def.EnforcingMode, `The programs are on every pod's device; "standard": a pod that no policy selects is allowed; "strict": a pod is denied until its policy is in the kernel (as the AWS network policy agent's NETWORK_POLICY_ENFORCING_MODE)`)
	flags.String("network-policy-attach", def.Attach, `How the policy programs are put on the pods' devices: "tcx" (kernel 6.6), "tc" (clsact), or "auto" (tcx where the kernel has it)`)
	flags.Duration("network-policy-attach-check-interval", def.AttachCheckInterval, "Check the programs on the pods' devices against the kernel this often (a program detached by hand is put back by then)")
	flags.Bool("policy-event-logs", def.PolicyEventLogs, "Log every packet the policy programs deny (\"Policy denied\", at info) and serve them on the agent API (GET /v1/policy/events, enimasq-dbg policy events), as the AWS network policy agent's enable-policy-event-logs")
}

// partSettings are the settings of the parts, from the flags.
type partSettings struct {
	cell.Out

	Source  source.Settings
	Compile compile.Settings
}

type settingsParams struct {
	cell.In

	Policy PolicyConfig
	// Client, when enabled, is the source instead of
	// --policy-endpoints-path.
	Client *k8sclient.Client `optional:"true"`
}

// newPartSettings validates the flags (the source's against the API
// client) and gives each part its settings. Errors name the flag.
func newPartSettings(p settingsParams) (partSettings, error) {
	c := p.Policy
	if err := c.validate(p.Client != nil && p.Client.IsEnabled()); err != nil {
		return partSettings{}, err
	}
	if err := checkPolicySource(c, p.Client); err != nil {
		return partSettings{}, err
	}
	s := partSettings{
		Source:  source.Settings{Path: c.PolicyEndpointsPath, Resync: c.PolicyEndpointsResyncInterval},
		Compile: compile.Settings{MaxEntries: c.PolicyMapMaxEntries},
	}
	if !c.EnableNetworkPolicy {
		s.Source.Off = "--enable-network-policy=false"
		s.Compile.Off = "network policy is disabled"
	}
	return s, nil
}

// Validate names the flag that is wrong, for the file source.
func (c PolicyConfig) Validate() error { return c.validate(false) }

// validate names the flag that is wrong. With the API server as the source
// (api), --policy-endpoints-path is not needed.
func (c PolicyConfig) validate(api bool) error {
	if !c.EnableNetworkPolicy {
		if c.PolicyEventLogs {
			return errors.New("--policy-event-logs needs --enable-network-policy: no policy program runs to deny a packet")
		}
		return nil
	}
	switch {
	case c.PolicyEndpointsPath == "" && !api:
		return errors.New("--enable-network-policy needs --policy-endpoints-path (or the Kubernetes API server: --k8s-kubeconfig-path, or run in a pod)")
	case c.PolicyEndpointsPath != "" && !filepath.IsAbs(c.PolicyEndpointsPath):
		return fmt.Errorf("--policy-endpoints-path %q: must be an absolute path", c.PolicyEndpointsPath)
	case c.PolicyMapMaxEntries == 0 || c.PolicyMapMaxEntries > maxPolicyMapEntries:
		return fmt.Errorf("--policy-map-max-entries %d: want 1..%d", c.PolicyMapMaxEntries, maxPolicyMapEntries)
	case c.PolicyConntrackMax < minConntrack || c.PolicyConntrackMax > maxConntrack:
		return fmt.Errorf("--policy-conntrack-max %d: want %d..%d", c.PolicyConntrackMax, minConntrack, maxConntrack)
	case c.PolicyEndpointsResyncInterval <= 0:
		return fmt.Errorf("--policy-endpoints-resync-interval %s: must be positive", c.PolicyEndpointsResyncInterval)
	case c.Attach != enforce.AttachAuto && c.Attach != enforce.AttachTCX && c.Attach != enforce.AttachTC:
		return fmt.Errorf("--network-policy-attach %q: want auto, tcx or tc", c.Attach)
	case c.AttachCheckInterval <= 0:
		return fmt.Errorf("--network-policy-attach-check-interval %s: must be positive", c.AttachCheckInterval)
	}
	if _, err := policybpf.ParsePolicyMode(c.EnforcingMode); err != nil {
		return fmt.Errorf("--network-policy-enforcing-mode: %w", err)
	}
	return nil
}

// checkPolicySource rejects --policy-endpoints-path together with an
// enabled API client: the PolicyEndpoints come from one source only.
func checkPolicySource(cfg PolicyConfig, client *k8sclient.Client) error {
	if !cfg.EnableNetworkPolicy || client == nil || !client.IsEnabled() || cfg.PolicyEndpointsPath == DefaultPolicyConfig.PolicyEndpointsPath {
		return nil
	}
	return fmt.Errorf("--policy-endpoints-path %s is set and the Kubernetes API server is enabled (%s): "+
		"the PolicyEndpoints come from one source; drop --policy-endpoints-path to read them from the API server, "+
		"or run without --k8s-kubeconfig-path outside a pod to read the directory",
		cfg.PolicyEndpointsPath, client.Source())
}

// AuditConfig is --policy-audit-mode, Cilium's flag with Cilium's meaning:
// the programs judge, count and report every packet as they do, and one
// the policy denies passes, counted (enimasq_policy_verdicts_total
// verdict="audit") and reported as "would deny". It is for rolling out a
// policy before enforcing it. The standalone agent declares it (AuditCell);
// linked into Cilium, Cilium declares it for its own policy and enimasq
// enforces nothing there, so Features leaves it out.
type AuditConfig struct {
	PolicyAuditMode bool `mapstructure:"policy-audit-mode"`
}

func (def AuditConfig) Flags(flags *pflag.FlagSet) {
	flags.Bool("policy-audit-mode", def.PolicyAuditMode, "Audit mode: a packet the network policy denies passes, counted (enimasq_policy_verdicts_total{verdict=\"audit\"}) and reported as \"Policy would deny\" with --policy-event-logs; drops before the policy (forged sources, malformed frames) stay drops. Restarting without it enforces at once")
}

// AuditCell declares --policy-audit-mode (the standalone agent's).
var AuditCell = cell.Config(AuditConfig{})
