// Package strictdecode is the one strict decoder of enimasq's inputs: the
// files (the ip-masq-agent config, the CiliumNode, PolicyEndpoints) and the
// API bodies and the checkpoint. It refuses what a lenient decoder would
// take without a word, because each of these puts a state in force that
// nobody wrote: a second document after "---", anything after the first
// value ({"a":1} {"b":2} reads as {"a":1}), a key given twice, a field the
// type does not have, a value of the wrong type. Every error names the
// field, by its path (spec.egress[1].ports[0].port), and the value.
//
// It is built on the decoders the API server uses (sigs.k8s.io/yaml for
// YAML, sigs.k8s.io/json for strict JSON), and names faults from the input
// and the Go types, never from a library's error text.
package strictdecode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrSyntax wraps the errors of input that is not one YAML or JSON document
// with each key once.
var ErrSyntax = errors.New("not valid YAML or JSON")

// Decoder decodes into Go types with json tags, strictly.
type Decoder struct {
	// Holds says what a field holds, by field name, in the error of a value
	// of the wrong type ("a list of CIDRs"); without it, the Go type says.
	Holds map[string]string
}

// Decode decodes data, one YAML or JSON document, into v. An error wraps
// ErrSyntax, or lists the fields that are wrong (Format).
func (d Decoder) Decode(data []byte, v any) error {
	js, err := ToJSON(data)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	if errs := d.Fields(nil, js, v); len(errs) > 0 {
		return Format(errs)
	}
	return nil
}

// DecodeJSON decodes data, one JSON value, into v (an API body, a
// checkpoint: no YAML).
func (d Decoder) DecodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var first json.RawMessage
	if err := dec.Decode(&first); err != nil {
		return fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	if rest := bytes.TrimSpace(data[dec.InputOffset():]); len(rest) > 0 {
		return fmt.Errorf("%w: data after the first value, at byte %d: one value is read", ErrSyntax, dec.InputOffset())
	}
	if errs := d.Fields(nil, first, v); len(errs) > 0 {
		return Format(errs)
	}
	return nil
}
