package agentapi

import (
	"encoding/json"
	"net/http"
)

// WriteJSON answers code with v as compact JSON (one line).
func WriteJSON(w http.ResponseWriter, code int, v any) { writeJSON(w, code, v, "") }

// WriteJSONIndent answers code with v as JSON indented by two spaces, for
// the answers a person reads as they are (IPAM's, /healthz).
func WriteJSONIndent(w http.ResponseWriter, code int, v any) { writeJSON(w, code, v, "  ") }

func writeJSON(w http.ResponseWriter, code int, v any, indent string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", indent)
	enc.Encode(v) // the status is sent: a failed write is the client's going
}

// WriteError answers code with the error body of err: {"error": its text,
// "reason": reason}, compact.
func WriteError(w http.ResponseWriter, code int, reason string, err error) {
	WriteJSON(w, code, Error{Message: err.Error(), Reason: reason})
}

// WriteBody answers code with body as it is, of contentType: an answer
// made elsewhere (expvar's values).
func WriteBody(w http.ResponseWriter, code int, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(code)
	w.Write(body)
}

// Stream is an answer of JSON lines (application/x-ndjson), one value a
// line, that a client reads as they come (Client.Stream).
type Stream struct {
	enc *json.Encoder
	rc  *http.ResponseController
}

// NewStream answers 200 with a stream of JSON lines, not cached.
func NewStream(w http.ResponseWriter) *Stream {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &Stream{enc: json.NewEncoder(w), rc: http.NewResponseController(w)}
}

// Encode writes v as a line; it is sent with the next Flush. An error is
// the client's going.
func (s *Stream) Encode(v any) error { return s.enc.Encode(v) }

// Flush sends what was written.
func (s *Stream) Flush() error { return s.rc.Flush() }
