package policymap

import (
	"fmt"
	"time"

	"github.com/enimasq/enimasq/cells/retryflags"

	"github.com/spf13/pflag"
)

// Config holds the reconciliation flags shared by the map features.
type Config struct {
	BPFMapRetryMin        time.Duration `mapstructure:"bpf-map-retry-min"`
	BPFMapRetryMax        time.Duration `mapstructure:"bpf-map-retry-max"`
	BPFMapRefreshInterval time.Duration `mapstructure:"bpf-map-refresh-interval"`

	// BPFMapFaultProbability makes map operations fail at random. For tests.
	BPFMapFaultProbability float64 `mapstructure:"bpf-map-fault-probability"`
}

var DefaultConfig = Config{
	BPFMapRetryMin:        100 * time.Millisecond,
	BPFMapRetryMax:        time.Minute,
	BPFMapRefreshInterval: 5 * time.Minute,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	retryflags.Declare(flags, "bpf-map", "BPF map entry", "Rewrite every BPF map entry and delete unknown ones",
		retryflags.Values{RetryMin: def.BPFMapRetryMin, RetryMax: def.BPFMapRetryMax, Refresh: def.BPFMapRefreshInterval})
	flags.Float64("bpf-map-fault-probability", def.BPFMapFaultProbability, "Testing only: make this fraction of BPF map operations fail")
	flags.MarkHidden("bpf-map-fault-probability")
}

// Validate checks the flags; every map feature calls it at registration.
func (c Config) Validate() error {
	retry := retryflags.Values{RetryMin: c.BPFMapRetryMin, RetryMax: c.BPFMapRetryMax, Refresh: c.BPFMapRefreshInterval}
	switch {
	case retry.Validate("bpf-map") != nil:
		return retry.Validate("bpf-map")
	case c.BPFMapFaultProbability < 0 || c.BPFMapFaultProbability > 1:
		return fmt.Errorf("--bpf-map-fault-probability %g: want 0..1", c.BPFMapFaultProbability)
	}
	return nil
}
