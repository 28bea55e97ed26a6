package policymap

import (
	"fmt"
	"time"

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
	flags.Duration("bpf-map-retry-min", def.BPFMapRetryMin, "Backoff before the first retry of a failed BPF map entry")
	flags.Duration("bpf-map-retry-max", def.BPFMapRetryMax, "Longest backoff between retries of a failed BPF map entry")
	flags.Duration("bpf-map-refresh-interval", def.BPFMapRefreshInterval, "Rewrite every BPF map entry and delete unknown ones this often (drift repair)")
	flags.Float64("bpf-map-fault-probability", def.BPFMapFaultProbability, "Testing only: make this fraction of BPF map operations fail")
	flags.MarkHidden("bpf-map-fault-probability")
}

// Validate checks the flags; every map feature calls it at registration.
func (c Config) Validate() error {
	switch {
	case c.BPFMapRetryMin <= 0 || c.BPFMapRetryMax < c.BPFMapRetryMin:
		return fmt.Errorf("--bpf-map-retry-min %s and --bpf-map-retry-max %s: want 0 < min <= max", c.BPFMapRetryMin, c.BPFMapRetryMax)
	case c.BPFMapRefreshInterval <= 0:
		return fmt.Errorf("--bpf-map-refresh-interval %s: must be positive", c.BPFMapRefreshInterval)
	case c.BPFMapFaultProbability < 0 || c.BPFMapFaultProbability > 1:
		return fmt.Errorf("--bpf-map-fault-probability %g: want 0..1", c.BPFMapFaultProbability)
	}
	return nil
}
