package ciliumnode

import "time"

// DefaultPath is the default --ciliumnode-path.
const DefaultPath = "/etc/config/ciliumnode"

// Settings are what the CiliumNode source takes (validated by the ipam
// cell, which owns the flags).
type Settings struct {
	// Off, when set, says why there are no ENIs: the table exists, is
	// initialized and stays empty.
	Off string
	// Path is --ciliumnode-path, read unless the API server is enabled.
	Path string
	// Resync is --ciliumnode-resync-interval.
	Resync time.Duration
	// LossGrace is --ciliumnode-loss-grace.
	LossGrace time.Duration
}
