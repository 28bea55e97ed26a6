// Package strictyaml turns a YAML or JSON input into the JSON of its one
// document, as sigs.k8s.io/yaml's YAMLToJSONStrict does (a key given twice
// is refused), and refuses what that function drops without a word: a second
// document after "---", or anything after the first value ({"a":1} {"b":2}
// reads as {"a":1}). A file whose second half is ignored would put in force
// a state nobody wrote.
package strictyaml

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// ToJSON is YAMLToJSONStrict of data, which must hold one document (a
// trailing "---" with nothing after it, or a comment, is no document).
func ToJSON(data []byte) ([]byte, error) {
	if err := OneDocument(data); err != nil {
		return nil, err
	}
	return yaml.YAMLToJSONStrict(data)
}

// OneDocument says why data does not hold exactly one YAML document, or nil.
// Input the YAML parser refuses is left to the caller's decoder, whose error
// names the fault.
//
// The YAML parser runs only where more than one document can be: JSON with
// something after its value, or YAML with a document marker ("---", "...")
// after its first line. Block YAML without one is a single document, and
// JSON is checked by the JSON scanner (a large PolicyEndpoint would
// otherwise be parsed twice).
func OneDocument(data []byte) error {
	if singleByLook(data) {
		return nil
	}
	return parsedOneDocument(data)
}

// parsedOneDocument is OneDocument by the YAML parser.
func parsedOneDocument(data []byte) error {
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	var first yamlv3.Node
	if err := dec.Decode(&first); err != nil {
		return nil
	}
	for {
		var next yamlv3.Node
		err := dec.Decode(&next)
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return fmt.Errorf("data after the first value (%w): a file holds one document", err)
		case !empty(&next):
			return fmt.Errorf("a second document at line %d: a file holds one document", next.Line)
		}
	}
}

// singleByLook says whether data is one document without parsing it as
// YAML: JSON with nothing but white space after its value, or a block
// mapping (its first significant line a plain key at column 0 and a colon) with no
// document marker line after that line.
func singleByLook(data []byte) bool {
	if bytes.Count(data, []byte("\r")) != bytes.Count(data, []byte("\r\n")) {
		return false // a lone CR breaks lines for YAML, not here
	}
	text := significant(data)
	if len(text) == 0 {
		return true
	}
	if flow := bytes.TrimLeft(text, " \t"); flow[0] == '{' || flow[0] == '[' {
		dec := json.NewDecoder(bytes.NewReader(flow))
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return false // flow YAML, or broken: the YAML parser says
		}
		return len(bytes.TrimSpace(flow[dec.InputOffset():])) == 0
	}
	first, rest, _ := bytes.Cut(text, []byte("\n"))
	if !blockKey.Match(first) {
		return false // not a block mapping: a scalar, an indicator, a marker
	}
	for len(rest) > 0 {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		if bytes.HasPrefix(line, []byte("---")) || bytes.HasPrefix(line, []byte("...")) {
			return false
		}
	}
	return true
}

// blockKey is the first line of a block mapping: a plain key, a colon.
var blockKey = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.\-/ ]*:(\s|$)`)

// significant is data from the start of its first line that is not blank
// or a comment (a byte order mark dropped).
func significant(data []byte) []byte {
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	for len(data) > 0 {
		line, rest, _ := bytes.Cut(data, []byte("\n"))
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			return data
		}
		data = rest
	}
	return nil
}

// empty says whether a document holds nothing (a "---" followed by nothing
// or comments only).
func empty(doc *yamlv3.Node) bool {
	if len(doc.Content) == 0 {
		return true
	}
	n := doc.Content[0]
	return len(doc.Content) == 1 && n.Kind == yamlv3.ScalarNode && n.Tag == "!!null" && n.Value == ""
}
