package netpolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"

	"github.com/enimasq/enimasq/cells/errtext"
)

// Strict decoding of JSON into the types of types.go, with errors that
// name the field path (spec.egress[1].except[0]) and the value. YAML is
// turned into JSON first (sigs.k8s.io/yaml, which refuses duplicate keys).

// decode reads js into v (a pointer to a type of types.go) the way the API
// server does: field names are case-sensitive, and a duplicate or unknown
// field is an error. base is js's path in the file.
func decode(base *field.Path, js []byte, v any) field.ErrorList {
	strict, err := kjson.UnmarshalStrict(js, v)
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		path, raw := locate(base, js, typeErr.Offset)
		return field.ErrorList{field.TypeInvalid(path, raw, "is not "+describe(path, typeErr.Type))}
	} else if err != nil { // js is valid JSON: not expected
		return field.ErrorList{field.InternalError(base, err)}
	}
	var errs field.ErrorList
	for _, e := range strict {
		var fe kjson.FieldError
		if !errors.As(e, &fe) {
			errs = append(errs, field.InternalError(base, e))
			continue
		}
		path := fe.FieldPath()
		if base != nil {
			path = base.String() + "." + path
		}
		if strings.HasPrefix(e.Error(), "duplicate") {
			errs = append(errs, &field.Error{Type: field.ErrorTypeDuplicate, Field: path})
			continue
		}
		parent, name := splitPath(fe.FieldPath())
		errs = append(errs, &field.Error{Type: field.ErrorTypeNotSupported, Field: path, BadValue: name,
			Detail: strings.Join(fieldNames(reflect.TypeOf(v), parent), ", ")})
	}
	return errs
}

// locate finds the value a decoding error at offset of js is about: the
// last value that starts before offset. It returns its path under base and
// its text.
func locate(base *field.Path, js []byte, offset int64) (*field.Path, json.RawMessage) {
	type container struct {
		path  *field.Path
		array bool
		n     int // values read (arrays), or keys and values read (objects)
		key   string
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	var (
		stack []*container
		found = base
		start int64
	)
	for {
		pos := dec.InputOffset()
		for pos < int64(len(js)) && strings.IndexByte(" \t\r\n,:", js[pos]) >= 0 {
			pos++
		}
		tok, err := dec.Token()
		if err != nil || pos >= offset {
			break
		}
		if tok == json.Delim('}') || tok == json.Delim(']') {
			stack = stack[:len(stack)-1]
			continue
		}
		path := base
		if len(stack) > 0 {
			c := stack[len(stack)-1]
			c.n++
			switch {
			case c.array:
				path = c.path.Index(c.n - 1)
			case c.n%2 == 1: // a key
				c.key, _ = tok.(string)
				continue
			default:
				path = c.path.Child(c.key)
			}
		}
		found, start = path, pos
		if tok == json.Delim('{') || tok == json.Delim('[') {
			stack = append(stack, &container{path: path, array: tok == json.Delim('[')})
		}
	}
	var raw json.RawMessage
	_ = json.NewDecoder(bytes.NewReader(js[start:])).Decode(&raw)
	return found, raw
}

// describe says what a field holds, for a value of the wrong type.
func describe(path *field.Path, t reflect.Type) string {
	_, name := splitPath(path.String())
	switch name {
	case "podIsolation":
		return "a list of policy types (Ingress, Egress)"
	case "except":
		return "a list of CIDRs"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice:
		return "a list"
	default:
		return "a mapping"
	}
}

// splitPath splits "spec.egress[0].cidrs" into "spec.egress[0]" and "cidrs".
func splitPath(path string) (parent, name string) {
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		return path[:i], path[i+1:]
	}
	return "", path
}

// fieldNames lists the JSON fields of the struct at path (list indices
// ignored) in t.
func fieldNames(t reflect.Type, path string) []string {
	var names []string
	for _, name := range append(strings.Split(path, "."), "") {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
		name, _, _ = strings.Cut(name, "[")
		names = names[:0]
		for _, f := range reflect.VisibleFields(t) {
			tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if tag == name {
				t = f.Type
			}
			names = append(names, tag)
		}
	}
	return names
}

// formatErrors writes errs as the docs show them:
//
//	field spec.egress[1].ports[0].port: value "http" is not an integer
func formatErrors(errs field.ErrorList) error {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		name := "field " + e.Field
		if e.Field == "<nil>" {
			name = "top level"
		}
		switch e.Type {
		case field.ErrorTypeRequired:
			msgs[i] = name + " is missing"
			if e.Detail != "" {
				msgs[i] += ": " + e.Detail
			}
		case field.ErrorTypeDuplicate:
			msgs[i] = name + " is given twice"
		case field.ErrorTypeNotSupported:
			msgs[i] = fmt.Sprintf("%s: unknown field %q (known: %s)", name, e.BadValue, e.Detail)
		case field.ErrorTypeInternal:
			msgs[i] = name + ": " + e.Detail
		default:
			msgs[i] = fmt.Sprintf("%s: value %s %s", name, showValue(e.BadValue), e.Detail)
		}
	}
	return errors.New(strings.Join(msgs, "; "))
}

func showValue(v any) string {
	switch v := v.(type) {
	case json.RawMessage:
		return errtext.Value(v)
	case string:
		return fmt.Sprintf("%q", v)
	}
	return fmt.Sprint(v)
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
				return nil, fmt.Errorf("line %d: document marker \"---\" followed by %q: put the document on the next line", line, errtext.Value(rest))
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
