package agentapi

import (
	"errors"
	"fmt"
)

// Error is the JSON body of every error answer of the agent API. An
// endpoint that says more embeds it (IPAM's ipamapi.Error adds the result
// of an allocation that stands).
type Error struct {
	Message string `json:"error"`
	// Reason is a stable, machine-readable name of the error.
	Reason string `json:"reason"`
}

// ErrInvalidRequest wraps the errors of a request that is refused as it
// is (400 invalid-request): a body or a query parameter the endpoint
// cannot read.
var ErrInvalidRequest = errors.New("invalid request")

// invalid is an ErrInvalidRequest error.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidRequest}, args...)...)
}
