// Package retryflags declares and checks a reconciler's retry and refresh
// flags, <prefix>-retry-min, <prefix>-retry-max and
// <prefix>-refresh-interval, the one way every feature that reconciles
// with the kernel names them (bpf-map-*, eni-netlink-*).
package retryflags

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Values are a reconciler's retry backoff bounds and its refresh period
// (drift repair).
type Values struct {
	RetryMin, RetryMax, Refresh time.Duration
}

// Declare declares the three flags with def's values: what names the
// objects retried ("BPF map entry"), refresh says what a refresh does.
func Declare(flags *pflag.FlagSet, prefix, what, refresh string, def Values) {
	flags.Duration(prefix+"-retry-min", def.RetryMin, "Backoff before the first retry of a failed "+what)
	flags.Duration(prefix+"-retry-max", def.RetryMax, "Longest backoff between retries of a failed "+what)
	flags.Duration(prefix+"-refresh-interval", def.Refresh, refresh+" this often (drift repair)")
}

// Validate checks 0 < min <= max and a positive refresh; the error names
// the flags.
func (v Values) Validate(prefix string) error {
	switch {
	case v.RetryMin <= 0 || v.RetryMax < v.RetryMin:
		return fmt.Errorf("--%s-retry-min %s and --%s-retry-max %s: want 0 < min <= max", prefix, v.RetryMin, prefix, v.RetryMax)
	case v.Refresh <= 0:
		return fmt.Errorf("--%s-refresh-interval %s: must be positive", prefix, v.Refresh)
	}
	return nil
}
