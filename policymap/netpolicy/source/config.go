package source

import "time"

// Settings are the source's settings, from the network-policy flags
// (package netpolicy).
type Settings struct {
	// Off, when set, says why there are no PolicyEndpoints (network policy
	// is disabled): the table is initialized and stays empty.
	Off string
	// Path is --policy-endpoints-path, the directory read unless the API
	// server is enabled.
	Path string
	// Resync is --policy-endpoints-resync-interval: the directory is
	// re-read (with the API server: the node's addresses re-checked) this
	// often.
	Resync time.Duration
}
