package ipmasq

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Whether the ip-masq-agent runs and where its file is are settings of the
// agent enimasq is linked into (nodeconfig.IPMasqAgent): the standalone
// agent declares them with Cilium's names (--enable-ip-masq-agent,
// --ip-masq-agent-config-path), a Cilium build takes them from Cilium's own
// flags. Config holds what only enimasq has.

// Config holds the ip-masq-agent flags that Cilium does not have.
type Config struct {
	IPMasqAgentResyncInterval time.Duration `mapstructure:"ip-masq-agent-resync-interval"`
}

// DefaultConfig re-reads the file every minute.
var DefaultConfig = Config{
	IPMasqAgentResyncInterval: 60 * time.Second,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Duration("ip-masq-agent-resync-interval", def.IPMasqAgentResyncInterval, "Re-read the ip-masq-agent config file this often, in case a file event was missed")
}

func (c Config) validate() error {
	if c.IPMasqAgentResyncInterval <= 0 {
		return fmt.Errorf("--ip-masq-agent-resync-interval %s: must be positive", c.IPMasqAgentResyncInterval)
	}
	return nil
}
