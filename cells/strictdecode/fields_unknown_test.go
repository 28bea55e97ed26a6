package strictdecode

import (
	"slices"
	"testing"
)

// TestSplitUnknown: the fields a type does not have are named by their
// paths, apart from the other errors; the known fields are decoded all the
// same, as a Kubernetes client decodes a newer object.
func TestSplitUnknown(t *testing.T) {
	type port struct {
		Port int `json:"port"`
	}
	type spec struct {
		Name  string `json:"name"`
		Ports []port `json:"ports"`
	}
	type object struct {
		Spec spec `json:"spec"`
	}
	for _, tc := range []struct {
		name, js string
		unknown  []string
		errs     string
		want     object
	}{
		{"none", `{"spec":{"name":"a"}}`, nil, "", object{spec{Name: "a"}}},
		{"top and nested", `{"spec":{"name":"a","subject":{"namespaces":{}},"ports":[{"port":1,"endPort":2}]},"extra":1}`,
			[]string{"spec.subject", "spec.ports[0].endPort", "extra"}, "", object{spec{Name: "a", Ports: []port{{1}}}}},
		{"duplicate stays an error", `{"spec":{"name":"a","name":"b","new":1}}`, []string{"spec.new"}, "field spec.name is given twice", object{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got object
			unknown, rest := SplitUnknown(Decoder{}.Fields(nil, []byte(tc.js), &got))
			slices.Sort(unknown)
			want := slices.Sorted(slices.Values(tc.unknown))
			if !slices.Equal(unknown, want) {
				t.Errorf("unknown = %q, want %q", unknown, want)
			}
			switch {
			case tc.errs == "" && len(rest) > 0:
				t.Errorf("errors %v, want none", Format(rest))
			case tc.errs != "" && (len(rest) == 0 || Format(rest).Error() != tc.errs):
				t.Errorf("errors %v, want %q", rest, tc.errs)
			case tc.errs == "" && !slices.Equal(got.Spec.Ports, tc.want.Spec.Ports) || tc.errs == "" && got.Spec.Name != tc.want.Spec.Name:
				t.Errorf("decoded %+v, want %+v", got, tc.want)
			}
		})
	}
}
