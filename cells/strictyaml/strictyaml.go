// Package strictyaml turns a YAML or JSON input into the JSON of its one
// document, as sigs.k8s.io/yaml's YAMLToJSONStrict does (a key given twice
// is refused), and refuses what that function drops without a word: a second
// document after "---", or anything after the first value ({"a":1} {"b":2}
// reads as {"a":1}). A file whose second half is ignored would put in force
// a state nobody wrote.
package strictyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"

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
func OneDocument(data []byte) error {
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
