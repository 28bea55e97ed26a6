package strictdecode

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
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
	for _, s := range []string{"a: 1\n", "a: 1\n---\nb: 2\n", `{"a":1} {"b":2}`, "- x\n- y\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// The look without parsing never calls one document what the
		// parser (and YAMLToJSONStrict) reads as several.
		if singleByLook(data) && parsedOneDocument(data) != nil {
			if _, err := yaml.YAMLToJSONStrict(data); err == nil {
				t.Errorf("%q: one document by look, several by the parser", data)
			}
		}
	})
}
