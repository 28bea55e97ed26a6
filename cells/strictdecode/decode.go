// Package strictdecode is the one strict decoder of enimasq's inputs: the
// files (the ip-masq-agent config, the CiliumNode, PolicyEndpoints) and the
// API bodies and the checkpoint. It refuses what a lenient decoder would
// take without a word, because each of these puts a state in force that
// nobody wrote: a second document after "---", anything after the first
// value ({"a":1} {"b":2} reads as {"a":1}), a key given twice, a field the
// type does not have, a value of the wrong type. Every error names the
// field, by its path (spec.egress[1].ports[0].port), and the value. The
// one exception is the objects of an API that a newer writer extends (the
// AWS controller's PolicyEndpoints): their unknown fields are split off by
// SplitUnknown, for the caller to name and ignore as a Kubernetes client
// does.
//
// It is built on the decoders the API server uses (sigs.k8s.io/yaml for
// YAML, sigs.k8s.io/json for strict JSON, apimachinery's YAML reader to
// split a stream into documents), and names faults from the input and the
// Go types, never from a library's error text.
//
// # The contract
//
// A file of several documents is split by Documents, as kubectl splits it,
// each document with its number and line. A document is decoded by
// Decoder.DecodeDocument: field names as in the json tags (with FoldCase,
// the top-level ones regardless of case, with a warning for each, as Go's
// encoding/json reads them), then the rules above.
//
// Two fast readers come first; when neither takes a document, the library
// reads it (sigs.k8s.io/yaml's YAMLToJSONStrict):
//
//   - the flat reader (flat.go) sets a struct directly, for a mapping of
//     its exact field names to scalars and lists of strings (the
//     ip-masq-agent file: 16,383 CIDRs in about a millisecond);
//   - the block reader (block.go) writes the JSON of a nested block
//     mapping (kubectl's output, a large PolicyEndpoint) for the fields
//     step.
//
// They hold to one rule set (lex.go). They take only printable ASCII lines
// ending in \n, with blank lines and whole-line comments anywhere; block
// mappings and sequences by indentation, each key once, keys plain words,
// addresses or whole numbers; and scalars that YAML cannot read two ways:
// plain words that are no YAML keyword (true, yes, null, ...), addresses
// and CIDRs, Go durations (1m30s), whole numbers without a leading zero,
// true and false, double-quoted text without escapes or quotes, and an
// empty [] or {} as a whole value. Anything else (flow collections, single
// quotes, anchors, tags, block scalars, trailing comments, document
// markers, tabs, CRs, a key given twice) they decline, and so does the
// flat reader for a key it does not have spelt exactly or a value not of
// its field's type.
//
// What a fast reader takes, the result is the library's for the same
// document: the same value, and so the same errors. A fast reader never
// fails: it declines, and the library's path gives the warnings and the
// errors. FuzzBlockToJSON and FuzzFlat (and ipmasq's FuzzDecodeFast, on its
// own type) hold them to sigs.k8s.io/yaml.
package strictdecode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
)

// ErrSyntax wraps the errors of input that is not one YAML or JSON document
// with each key once.
var ErrSyntax = errors.New("not valid YAML or JSON")

// Decoder decodes into Go types with json tags, strictly.
type Decoder struct {
	// Holds says what a field holds, by field name, in the error of a value
	// of the wrong type ("a list of CIDRs"); without it, the Go type says.
	Holds map[string]string
	// FoldCase matches the top-level field names of a document regardless
	// of case, with a warning naming the spelling read; a field given
	// twice so is an error.
	FoldCase bool
}

// Decode decodes data, one YAML or JSON document, into v. An error wraps
// ErrSyntax, or lists the fields that are wrong (Format). It is
// DecodeDocument without the warnings.
func (d Decoder) Decode(data []byte, v any) error {
	_, err := d.DecodeDocument(data, v)
	return err
}

// DecodeDocument decodes data, one YAML or JSON document, into v (a
// pointer to a zero value): by a fast reader when one takes it, else
// through sigs.k8s.io/yaml. The warnings are those of FoldCase.
func (d Decoder) DecodeDocument(data []byte, v any) ([]string, error) {
	if decodeFlat(data, v) {
		return nil, nil
	}
	return d.decode(data, v, true)
}

// DecodeFast is the fast readers alone: true when one takes data, and v
// then holds what DecodeDocument gives, without a warning or an error;
// false, and v untouched, when they decline.
func (d Decoder) DecodeFast(data []byte, v any) bool {
	if decodeFlat(data, v) {
		return true
	}
	js, ok := blockToJSON(data)
	if !ok {
		return false
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return false
	}
	tmp := reflect.New(rv.Elem().Type())
	if mappingError(js, tmp.Interface()) != nil || len(d.Fields(nil, js, tmp.Interface())) > 0 {
		return false
	}
	rv.Elem().Set(tmp.Elem())
	return true
}

// DecodeLibrary is DecodeDocument without the fast readers: what they are
// held to.
func (d Decoder) DecodeLibrary(data []byte, v any) ([]string, error) {
	return d.decode(data, v, false)
}

// decode is the path for any input: the document's JSON (by the block
// reader when fast), then its fields.
func (d Decoder) decode(data []byte, v any, fast bool) ([]string, error) {
	js, err := toJSON(data, fast)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	if err := mappingError(js, v); err != nil {
		return nil, err
	}
	errs := d.Fields(nil, js, v)
	if d.FoldCase && len(errs) > 0 {
		folded, warnings, err := foldNames(js, v)
		if err != nil {
			return nil, err
		}
		if warnings != nil {
			rv := reflect.ValueOf(v).Elem()
			rv.SetZero() // the first pass wrote into it
			if errs = d.Fields(nil, folded, v); len(errs) == 0 {
				return warnings, nil
			}
		}
	}
	if len(errs) > 0 {
		return nil, Format(errs)
	}
	return nil, nil
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
