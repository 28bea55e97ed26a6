package ipmasq

import (
	"errors"
	"time"

	"github.com/spf13/pflag"
)

// Config holds the ip-masq-agent flags, with Cilium's names.
type Config struct {
	EnableIPMasqAgent         bool          `mapstructure:"enable-ip-masq-agent"`
	IPMasqAgentConfigPath     string        `mapstructure:"ip-masq-agent-config-path"`
	EnableBPFMasquerade       bool          `mapstructure:"enable-bpf-masquerade"`
	EnableIPv4Masquerade      bool          `mapstructure:"enable-ipv4-masquerade"`
	EnableIPv6Masquerade      bool          `mapstructure:"enable-ipv6-masquerade"`
	IPMasqAgentResyncInterval time.Duration `mapstructure:"ip-masq-agent-resync-interval"`
}

// DefaultConfig is Cilium's defaults.
var DefaultConfig = Config{
	EnableIPMasqAgent:         false,
	IPMasqAgentConfigPath:     "/etc/config/ip-masq-agent",
	EnableBPFMasquerade:       false,
	EnableIPv4Masquerade:      true,
	EnableIPv6Masquerade:      true,
	IPMasqAgentResyncInterval: 60 * time.Second,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Bool("enable-ip-masq-agent", def.EnableIPMasqAgent, "Read the non-masquerade CIDRs from the ip-masq-agent config file (needs --enable-bpf-masquerade)")
	flags.String("ip-masq-agent-config-path", def.IPMasqAgentConfigPath, "ip-masq-agent config file (YAML or JSON); its directory is watched")
	flags.Bool("enable-bpf-masquerade", def.EnableBPFMasquerade, "Masquerade in BPF (the ip-masq-agent programs Cilium's ipmasq maps)")
	flags.Bool("enable-ipv4-masquerade", def.EnableIPv4Masquerade, "Masquerade IPv4 traffic leaving the node")
	flags.Bool("enable-ipv6-masquerade", def.EnableIPv6Masquerade, "Masquerade IPv6 traffic leaving the node")
	flags.Duration("ip-masq-agent-resync-interval", def.IPMasqAgentResyncInterval, "Re-read the config file this often, in case a file event was missed")
}

// Validate refuses, as Cilium does, an ip-masq-agent without BPF
// masquerading, naming the missing flag.
func (c Config) Validate() error {
	if !c.EnableIPMasqAgent {
		return nil
	}
	switch {
	case !c.EnableBPFMasquerade:
		return errors.New("--enable-ip-masq-agent needs --enable-bpf-masquerade")
	case !c.EnableIPv4Masquerade && !c.EnableIPv6Masquerade:
		return errors.New("--enable-ip-masq-agent needs --enable-ipv4-masquerade or --enable-ipv6-masquerade")
	case c.IPMasqAgentConfigPath == "":
		return errors.New("--enable-ip-masq-agent needs --ip-masq-agent-config-path")
	case c.IPMasqAgentResyncInterval <= 0:
		return errors.New("--ip-masq-agent-resync-interval must be positive")
	}
	return nil
}
