package agentapi

import (
	"io"
	"net/http"

	"github.com/enimasq/enimasq/cells/strictdecode"
)

// DecodeBody decodes the JSON body of r into v strictly (strictdecode): a
// field given twice, a field v does not have, a value of the wrong type or
// data after the value is refused, naming it. A body over limit bytes is
// refused unread. want shows the expected shape in the error. Every error
// wraps ErrInvalidRequest.
func DecodeBody(r *http.Request, limit int64, v any, want string) error {
	data, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return invalid("body: %w", err)
	}
	if int64(len(data)) > limit {
		return invalid("body larger than %d bytes", limit)
	}
	if err := (strictdecode.Decoder{}).DecodeJSON(data, v); err != nil {
		return invalid("body: want %s: %w", want, err)
	}
	return nil
}
