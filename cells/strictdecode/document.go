package strictdecode

// The document level: one YAML or JSON document, each key once, as JSON.

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

// ToJSON is the JSON of data's one YAML or JSON document (a trailing "---"
// with nothing after it, or a comment, is no document), as the API server
// reads YAML (sigs.k8s.io/yaml). A key given twice is an error naming it
// and its line.
func ToJSON(data []byte) ([]byte, error) {
	if err := OneDocument(data); err != nil {
		return nil, err
	}
	if js, ok := blockToJSON(data); ok {
		return js, nil
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		// Name the fault from the document itself, not from the error's
		// text: a key given twice, found by walking the parsed nodes; else
		// the parser's own error.
		if dup := duplicateKey(data); dup != nil {
			return nil, dup
		}
		return nil, err
	}
	return js, nil
}

// duplicateKey returns an error naming the first key given twice in a
// mapping of data's first document, or nil.
func duplicateKey(data []byte) error {
	var doc yamlv3.Node
	if yamlv3.Unmarshal(data, &doc) != nil {
		return nil
	}
	var walk func(n *yamlv3.Node, path string) error
	walk = func(n *yamlv3.Node, path string) error {
		if n.Kind == yamlv3.MappingNode {
			seen := map[string]bool{}
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				if k.Kind == yamlv3.ScalarNode {
					if seen[k.Value] {
						return fmt.Errorf("duplicate key %q at line %d%s: a key is given once", k.Value, k.Line, where(path))
					}
					seen[k.Value] = true
				}
				if err := walk(n.Content[i+1], join(path, k.Value)); err != nil {
					return err
				}
			}
			return nil
		}
		for i, c := range n.Content {
			p := path
			if n.Kind == yamlv3.SequenceNode {
				p = fmt.Sprintf("%s[%d]", path, i)
			}
			if err := walk(c, p); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(&doc, "")
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func where(path string) string {
	if path == "" {
		return ""
	}
	return " (in " + path + ")"
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
