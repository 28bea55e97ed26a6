package strictdecode

// The document level: one YAML or JSON document, each key once, as JSON.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// ToJSON is the JSON of data's one YAML or JSON document, as the API
// server reads YAML (sigs.k8s.io/yaml): the block reader's when it takes
// data, else the library's. Documents that hold nothing (blanks, comments)
// do not count; two that hold something are an error naming the line of
// the second, and so is a key given twice (naming it and its line).
func ToJSON(data []byte) ([]byte, error) { return toJSON(data, true) }

// toJSON is ToJSON, by the block reader when fast.
func toJSON(data []byte, fast bool) ([]byte, error) {
	docs, err := Documents(data)
	if err != nil {
		return nil, err
	}
	var doc []byte
	for _, d := range docs {
		switch {
		case d.Empty():
		case doc != nil:
			return nil, fmt.Errorf("a second document at line %d: a file holds one document", d.Line)
		default:
			doc = d.Data
		}
	}
	if fast {
		if js, ok := blockToJSON(doc); ok {
			return js, nil
		}
	}
	if !oneValue(doc) {
		// The library reads the first value and drops the rest.
		if err := parsedOneDocument(doc); err != nil {
			return nil, err
		}
	}
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		// Name the fault from the document itself, not from the error's
		// text: a key given twice, found by walking the parsed nodes; a
		// value after the first; else the parser's own error.
		if dup := duplicateKey(doc); dup != nil {
			return nil, dup
		}
		if more := parsedOneDocument(doc); more != nil {
			return nil, more
		}
		return nil, err
	}
	return js, nil
}

// oneValue says, without parsing it as YAML, that doc holds one value: no
// document end marker ("..."), and if it is flow (JSON), nothing but
// white space after its value. Else the YAML parser says.
func oneValue(doc []byte) bool {
	if bytes.HasPrefix(doc, []byte("...")) || bytes.Contains(doc, []byte("\n...")) {
		return false
	}
	text := bytes.TrimLeft(significant(doc), " \t\r\n")
	if len(text) == 0 || (text[0] != '{' && text[0] != '[') {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(text))
	var v json.RawMessage
	if dec.Decode(&v) != nil {
		return false // flow YAML, or broken
	}
	return len(bytes.TrimSpace(text[dec.InputOffset():])) == 0
}

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

// parsedOneDocument says why the YAML parser reads more than one document,
// or a value after the first, in data; nil also for input it refuses,
// which the caller's decoder names.
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

// empty says whether a document holds nothing (a "---" followed by nothing
// or comments only).
func empty(doc *yamlv3.Node) bool {
	if len(doc.Content) == 0 {
		return true
	}
	n := doc.Content[0]
	return len(doc.Content) == 1 && n.Kind == yamlv3.ScalarNode && n.Tag == "!!null" && n.Value == ""
}
