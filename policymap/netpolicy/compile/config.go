package compile

// Settings are the compiler's settings, from the network-policy flags
// (package netpolicy).
type Settings struct {
	// Off, when set, says why there are no policy maps (network policy is
	// disabled): nothing is derived or reconciled, no map is made.
	Off string
	// MaxEntries is --policy-map-max-entries, the size of each policy map.
	MaxEntries uint32
}
