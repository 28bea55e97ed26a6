package k8sclient

import "time"

// SetProbeIntervals shortens the API server probe's heartbeat and backoff
// for a test and returns the function that restores them. Call it before
// the hive starts, restore after it stopped.
func SetProbeIntervals(heartbeat, backoffMin, backoffMax time.Duration) (restore func()) {
	h, lo, hi := heartbeatInterval, retryMin, retryMax
	heartbeatInterval, retryMin, retryMax = heartbeat, backoffMin, backoffMax
	return func() { heartbeatInterval, retryMin, retryMax = h, lo, hi }
}

// NewClientEnv is NewClient with the environment and hostname given.
func NewClientEnv(cfg Config, env map[string]string, hostname string) (*Client, error) {
	return newClient(cfg,
		func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		func() (string, error) { return hostname, nil })
}
