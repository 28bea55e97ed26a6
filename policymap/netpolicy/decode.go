package netpolicy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Strict decoding of JSON values with errors that name the field path
// (spec.egress[1].except[0]) and the value. YAML is turned into JSON first
// (sigs.k8s.io/yaml, which refuses duplicate keys).

// object decodes raw as a JSON object whose keys are all in known. A null
// is an empty object.
func object(path string, raw json.RawMessage, known ...string) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("%s: value %s is not a mapping (fields: %s)", fieldName(path), quoteValue(raw), strings.Join(known, ", "))
	}
	for _, name := range sortedKeys(fields) {
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("%s: unknown field %q (known: %s)", fieldName(join(path, name)), name, strings.Join(known, ", "))
		}
	}
	for name, v := range fields {
		if isNull(v) {
			delete(fields, name)
		}
	}
	return fields, nil
}

// list decodes raw as a JSON array. A null is an empty list.
func list(path string, raw json.RawMessage, what string) ([]json.RawMessage, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("%s: value %s is not a list of %s", fieldName(path), quoteValue(raw), what)
	}
	return items, nil
}

// str decodes raw as a JSON string.
func str(path string, raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s: value %s is not a string", fieldName(path), quoteValue(raw))
	}
	return s, nil
}

// integer decodes raw as a JSON integer in [lo, hi]. A quoted number is not
// an integer.
func integer(path string, raw json.RawMessage, lo, hi int64) (int64, error) {
	trimmed := bytes.TrimSpace(raw)
	var n json.Number
	if len(trimmed) == 0 || trimmed[0] == '"' || json.Unmarshal(trimmed, &n) != nil {
		return 0, fmt.Errorf("%s: value %s is not an integer", fieldName(path), quoteValue(raw))
	}
	v, err := n.Int64()
	if err != nil {
		return 0, fmt.Errorf("%s: value %s is not an integer", fieldName(path), quoteValue(raw))
	}
	if v < lo || v > hi {
		return 0, fmt.Errorf("%s: value %d is outside %d..%d", fieldName(path), v, lo, hi)
	}
	return v, nil
}

func isNull(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// join appends a field name to a path.
func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// at appends a list index to a path.
func at(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }

func fieldName(path string) string {
	if path == "" {
		return "top level"
	}
	return "field " + path
}

// quoteValue shows a JSON value in an error, shortened.
func quoteValue(raw []byte) string {
	s := string(bytes.TrimSpace(raw))
	if len(s) > 64 {
		s = s[:61] + "..."
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// splitDocuments splits a YAML stream at its document markers the way
// kubectl does: a line that starts with "---" followed by nothing, blanks or
// a comment. YAML does not allow "---" at the start of a line inside a
// document, so this is exact. Documents with nothing but blanks and
// comments are kept (as empty documents) so that numbering follows the file.
func splitDocuments(data []byte) ([][]byte, error) {
	var docs [][]byte
	start := 0
	line := 1
	for pos := 0; pos < len(data); {
		end := bytes.IndexByte(data[pos:], '\n')
		if end < 0 {
			end = len(data)
		} else {
			end += pos + 1
		}
		l := data[pos:end]
		if rest, ok := bytes.CutPrefix(l, []byte("---")); ok {
			rest = bytes.TrimSpace(rest)
			if len(rest) > 0 && rest[0] != '#' {
				return nil, fmt.Errorf("line %d: document marker \"---\" followed by %q: put the document on the next line", line, quoteValue(rest))
			}
			if pos > 0 {
				docs = append(docs, data[start:pos])
			}
			start = end
		}
		pos = end
		line++
	}
	return append(docs, data[start:]), nil
}
