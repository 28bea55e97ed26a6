package strictdecode

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"
)

func TestToJSON(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"a: 1\n", `{"a":1}`, ""},
		{`{"a": 1}`, `{"a":1}`, ""},
		{"\ufeffa: 1\r\nb: [x]\r\n", `{"a":1,"b":["x"]}`, ""},
		{"a: 1\n---\n", `{"a":1}`, ""},
		{"a: 1\n---\n# nothing more\n", `{"a":1}`, ""},
		{"a: 1\n...\n", `{"a":1}`, ""},
		{"", "null", ""},
		{"a: 1\n---\nb: 2\n", "", "a second document at line 2"},
		{`{"a":1} {"b":2}`, "", "data after the first value"},
		{"{\"a\":1}\n{\"b\":2}\n", "", "data after the first value"},
		{"a: 1\na: 2\n", "", `duplicate key "a" at line 2`},
		{"{\"a\": 1} # a comment\n", `{"a":1}`, ""},
		{"---\na: 1\n", `{"a":1}`, ""},
		{"{a: 1} {b: 2}", "", "data after the first value"},
		{"a: 1\n...\nb: 2\n", "", "data after the first value"},
		{"---\n---\na: 1\n", `{"a":1}`, ""},
		{"a: 1\n--- {b: 2}\n", "", `line 2: document marker "---" followed by "{b: 2}"`},
		{"# c\nnonMasqueradeCIDRs: []\n", `{"nonMasqueradeCIDRs":[]}`, ""},
	} {
		js, err := ToJSON([]byte(tc.in))
		switch {
		case tc.err == "" && (err != nil || string(js) != tc.want):
			t.Errorf("%q: %s, %v; want %s", tc.in, js, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %s, %v; want an error with %q", tc.in, js, err, tc.err)
		}
	}
}

func FuzzOneDocument(f *testing.F) {
	for _, s := range []string{"a: 1\n", "a: 1\n---\nb: 2\n", `{"a":1} {"b":2}`, "- x\n- y\n", "a: 1\n...\nb: 2\n", "---\n---\na: 1\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// What ToJSON reads as one document, the YAML parser never reads
		// as several: nothing is dropped.
		if _, err := ToJSON(data); err == nil && parsedDocuments(data) > 1 {
			t.Errorf("%q: one document for ToJSON, %d for the parser", data, parsedDocuments(data))
		}
	})
}

// parsedDocuments is the number of documents that hold something, as the
// YAML parser reads data (0 where it fails).
func parsedDocuments(data []byte) int {
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	n := 0
	for {
		var doc yamlv3.Node
		if err := dec.Decode(&doc); err != nil {
			if !errors.Is(err, io.EOF) {
				return 0
			}
			return n
		}
		if !empty(&doc) {
			n++
		}
	}
}
