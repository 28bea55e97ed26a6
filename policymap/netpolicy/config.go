package netpolicy

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/bpf"
)

// PolicyConfig holds the network-policy flags: where the PolicyEndpoint
// objects come from and how large the policy maps are. The reconciliation
// flags (retries, refresh) are Config's, shared with the ipmasq maps.
type PolicyConfig struct {
	EnableNetworkPolicy           bool          `mapstructure:"enable-network-policy"`
	PolicyEndpointsPath           string        `mapstructure:"policy-endpoints-path"`
	PolicyMapMaxEntries           uint32        `mapstructure:"policy-map-max-entries"`
	PolicyEndpointsResyncInterval time.Duration `mapstructure:"policy-endpoints-resync-interval"`
}

// DefaultPolicyConfig has network policy off.
var DefaultPolicyConfig = PolicyConfig{
	EnableNetworkPolicy:           false,
	PolicyEndpointsPath:           "",
	PolicyMapMaxEntries:           bpf.PolicyDefaultMaxEntries,
	PolicyEndpointsResyncInterval: 60 * time.Second,
}

// maxPolicyMapEntries bounds --policy-map-max-entries: each entry of a full
// map costs about 400 bytes of kernel memory.
const maxPolicyMapEntries = 1 << 22

func (def PolicyConfig) Flags(flags *pflag.FlagSet) {
	flags.Bool("enable-network-policy", def.EnableNetworkPolicy, "Program the per-pod network-policy maps from the PolicyEndpoint objects: from the Kubernetes API server when it is enabled, else from --policy-endpoints-path")
	flags.String("policy-endpoints-path", def.PolicyEndpointsPath, "Directory of PolicyEndpoint files (networking.k8s.aws/v1alpha1, YAML or JSON, several documents or a List per file); it is watched. Not allowed with the Kubernetes API server, which is then the source")
	flags.Uint32("policy-map-max-entries", def.PolicyMapMaxEntries, "Size of each network-policy map (enimasq_egress_v4/_v6, enimasq_ingress_v4/_v6)")
	flags.Duration("policy-endpoints-resync-interval", def.PolicyEndpointsResyncInterval, "Re-read the PolicyEndpoint directory this often, in case a file event was missed (with the API server: re-check the node's addresses this often)")
}

// Validate names the flag that is wrong, for the file source.
func (c PolicyConfig) Validate() error { return c.validate(false) }

// validate names the flag that is wrong. With the API server as the source
// (api), --policy-endpoints-path is not needed.
func (c PolicyConfig) validate(api bool) error {
	if !c.EnableNetworkPolicy {
		return nil
	}
	switch {
	case c.PolicyEndpointsPath == "" && !api:
		return errors.New("--enable-network-policy needs --policy-endpoints-path (or the Kubernetes API server: --k8s-kubeconfig-path, or run in a pod)")
	case c.PolicyEndpointsPath != "" && !filepath.IsAbs(c.PolicyEndpointsPath):
		return fmt.Errorf("--policy-endpoints-path %q: must be an absolute path", c.PolicyEndpointsPath)
	case c.PolicyMapMaxEntries == 0 || c.PolicyMapMaxEntries > maxPolicyMapEntries:
		return fmt.Errorf("--policy-map-max-entries %d: want 1..%d", c.PolicyMapMaxEntries, maxPolicyMapEntries)
	case c.PolicyEndpointsResyncInterval <= 0:
		return fmt.Errorf("--policy-endpoints-resync-interval %s: must be positive", c.PolicyEndpointsResyncInterval)
	}
	return nil
}
