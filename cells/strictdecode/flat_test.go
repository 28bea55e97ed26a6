package strictdecode

import (
	"reflect"
	"testing"
)

// flatType has a field of every kind the flat reader sets, and some it
// does not.
type flatType struct {
	Names   []string          `json:"names"`
	On      bool              `json:"enabled"`
	Count   int8              `json:"count"`
	Size    uint16            `json:"size"`
	Limit   *int              `json:"limit,omitempty"`
	Period  string            `json:"period"`
	Name    *string           `json:"name"`
	Nested  struct{ A int }   `json:"nested"`
	Labels  map[string]string `json:"labels"`
	Ratio   float64           `json:"ratio"`
	Ignored string            `json:"-"`
}

var flatSeeds = []string{
	"names:\n- 10.0.0.0/8\n- 172.16.0.0/12\nenabled: false\n",
	"names:\n  - a\n  - \"b c\"\n  - 2001:db8::/32\ncount: 127\nsize: 65535\n",
	"# comment\nnames:\n\n- 10.0.0.0/8\n  # between\n- 10.1.2.3/8\nlimit: 10\nperiod: 1m30s\n",
	"names: []\nenabled: true\n", "names:\nenabled: true\n", "enabled: true\n", "on: true\n", "count: 128\n", "size: 65536\n", "count: -1\n",
	"names:\n- a\n  - b\n", "names:\n- a # c\n", "names:\n- 'a'\n", "names:\n- a\nnames:\n- a\n", "Names:\n- a\n",
	"names:\n- a", "limit: 010\n", "limit: 0\nperiod: 1.5h\n", "period: 60\n", "enabled: yes\n", "enabled: True\n",
	"names:\n- ::/0\n- 1:2/3\n- 0/0\n", "names:\r\n- a\r\n", "name: \"x\"\n", "name:\n", "nested:\n  A: 1\n",
	"ratio: 1\n", "names:\n- a\n- b: c\n", "names:\n-\n", "names:\n- - a\n", "period: a\nb\n", "period: a\n  b\n",
	"names: {}\n", "enabled: []\n", "period: \"\"\n", "names:\n- null\n", "names:\n- Yes\n", "period: 12:30\n",
}

// FuzzFlat: whatever the flat reader takes, the library's path reads the
// same, with no warning or error.
func FuzzFlat(f *testing.F) {
	for _, s := range flatSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkFlat)
}

func TestFlatMatchesTheLibrary(t *testing.T) {
	for _, s := range flatSeeds {
		checkFlat(t, []byte(s))
	}
	for _, s := range flatSeeds[:4] {
		var v flatType
		if !decodeFlat([]byte(s), &v) {
			t.Errorf("the flat reader declines %q", s)
		}
	}
}

func checkFlat(t *testing.T, data []byte) {
	var fast flatType
	if !decodeFlat(data, &fast) {
		if !reflect.DeepEqual(fast, flatType{}) {
			t.Fatalf("%q: declined, but wrote %+v", data, fast)
		}
		return
	}
	var full flatType
	warnings, err := Decoder{FoldCase: true}.DecodeLibrary(data, &full)
	if err != nil || len(warnings) > 0 {
		t.Fatalf("%q: the flat reader read %+v, the library: %v %q", data, fast, err, warnings)
	}
	if !reflect.DeepEqual(fast, full) {
		t.Fatalf("%q:\nflat    %+v\nlibrary %+v", data, fast, full)
	}
}
