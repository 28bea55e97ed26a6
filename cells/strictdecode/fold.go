package strictdecode

// The top level of a document into a struct: a mapping, and its field
// names regardless of case (Decoder.FoldCase).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/enimasq/enimasq/cells/errtext"
)

// jsonNames are the json names of the fields of the struct v points to, in
// their order; nil if v is not a pointer to a struct.
func jsonNames(v any) []string {
	t := reflect.TypeOf(v)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return nil
	}
	var names []string
	for _, f := range reflect.VisibleFields(t.Elem()) {
		if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag != "" && tag != "-" && f.IsExported() {
			names = append(names, tag)
		}
	}
	return names
}

// mappingError says that js is not a mapping when v is a struct, naming
// its fields; nil for a mapping, null (an empty document), or another v.
func mappingError(js []byte, v any) error {
	names := jsonNames(v)
	if names == nil {
		return nil
	}
	js = bytes.TrimSpace(js)
	if bytes.HasPrefix(js, []byte("{")) || bytes.Equal(js, []byte("null")) {
		return nil
	}
	return fmt.Errorf("want a mapping with the fields %s, got %s", strings.Join(names, ", "), errtext.Value(js))
}

// foldNames renames the top-level fields of js, a mapping, that match a
// field of v regardless of case to its name, with a warning for each;
// nil warnings when none is renamed. A field given twice so is an error.
func foldNames(js []byte, v any) ([]byte, []string, error) {
	known := jsonNames(v)
	var fields map[string]json.RawMessage
	if known == nil || json.Unmarshal(js, &fields) != nil {
		return nil, nil, nil
	}
	var warnings []string
	seen := map[string]string{}
	folded := make(map[string]json.RawMessage, len(fields))
	for _, given := range slices.Sorted(maps.Keys(fields)) {
		name := given
		if !slices.Contains(known, given) {
			for _, k := range known {
				if strings.EqualFold(given, k) {
					name = k
				}
			}
		}
		if other, dup := seen[name]; dup {
			return nil, nil, fmt.Errorf("field %s is given twice (%q and %q)", name, other, given)
		}
		seen[name] = given
		if name != given {
			warnings = append(warnings, fmt.Sprintf("field %q is read as %s (field names are matched regardless of case, as Go's encoding/json, and so Cilium, does)", given, name))
		}
		folded[name] = fields[given]
	}
	if warnings == nil {
		return nil, nil, nil
	}
	out, err := json.Marshal(folded)
	return out, warnings, err
}
