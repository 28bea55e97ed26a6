package netpolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
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
	switch {
	case errors.As(err, &typeErr):
		path, start := locate(json.NewDecoder(bytes.NewReader(js)), js, base, typeErr.Offset)
		var raw json.RawMessage
		_ = json.NewDecoder(bytes.NewReader(js[start:])).Decode(&raw)
		return field.ErrorList{field.TypeInvalid(path, raw, "is not "+describe(path, typeErr.Type))}
	case err != nil: // not expected: js is JSON, and no type of types.go has an UnmarshalJSON that fails
		return field.ErrorList{field.InternalError(base, err)}
	}
	var errs field.ErrorList
	for _, e := range strict {
		var fe kjson.FieldError
		errors.As(e, &fe) // every strict error is one
		path := strings.TrimPrefix(base.String()+"."+fe.FieldPath(), "<nil>.")
		if strings.HasPrefix(e.Error(), "duplicate") {
			errs = append(errs, &field.Error{Type: field.ErrorTypeDuplicate, Field: path})
			continue
		}
		known, name := unknownField(elem(reflect.TypeOf(v)), fe.FieldPath())
		errs = append(errs, &field.Error{Type: field.ErrorTypeNotSupported, Field: path, BadValue: name,
			Detail: strings.Join(known, ", ")})
	}
	return errs
}

// locate finds the value a decoding error at offset is about, the innermost
// value that starts before offset, in the value dec reads next (at path in
// js). It returns its path and where it starts.
func locate(dec *json.Decoder, js []byte, path *field.Path, offset int64) (*field.Path, int64) {
	start := dec.InputOffset()
	for start < int64(len(js)) && strings.IndexByte(" \t\r\n,:", js[start]) >= 0 {
		start++
	}
	found, at := path, start
	if tok, err := dec.Token(); err == nil && start < offset && (tok == json.Delim('{') || tok == json.Delim('[')) {
		for i := 0; dec.More() && dec.InputOffset() < offset; i++ {
			child := path.Index(i)
			if tok == json.Delim('{') {
				key, _ := dec.Token()
				name, _ := key.(string)
				child = path.Child(name)
			}
			p, s := locate(dec, js, child, offset)
			if s >= offset {
				break
			}
			found, at = p, s
		}
		_, _ = dec.Token() // the closing delimiter
	}
	return found, at
}

// describe says what a field holds, for a value of the wrong type.
func describe(path *field.Path, t reflect.Type) string {
	p := path.String()
	if d, ok := map[string]string{"podIsolation": "a list of policy types (Ingress, Egress)", "except": "a list of CIDRs"}[p[strings.LastIndexByte(p, '.')+1:]]; ok {
		return d
	}
	if d, ok := map[reflect.Kind]string{reflect.String: "a string", reflect.Int64: "an integer", reflect.Slice: "a list"}[t.Kind()]; ok {
		return d
	}
	return "a mapping"
}

// fieldSep is what separates a field name from the next in a path.
var fieldSep = regexp.MustCompile(`^(\[[0-9]+\])*\.`)

// unknownField splits the path of an unknown field in struct t (a path of
// known struct fields and list indices, then the name, which may hold dots)
// into the fields of the struct that holds it and its name.
func unknownField(t reflect.Type, path string) (known []string, name string) {
	for {
		var next reflect.Type
		var rest string
		known = known[:0]
		for _, f := range reflect.VisibleFields(t) {
			tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			known = append(known, tag)
			sep := fieldSep.FindString(strings.TrimPrefix(path, tag))
			if strings.HasPrefix(path, tag) && sep != "" && elem(f.Type).Kind() == reflect.Struct {
				next, rest = elem(f.Type), path[len(tag)+len(sep):]
			}
		}
		if next == nil {
			return known, path
		}
		t, path = next, rest
	}
}

// elem is the type of the values of t's lists and pointers.
func elem(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	return t
}

// formatErrors writes errs as the docs show them:
//
//	field spec.egress[1].ports[0].port: value "http" is not an integer
func formatErrors(errs field.ErrorList) error {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		switch e.Type {
		case field.ErrorTypeRequired:
			msgs[i] = strings.TrimSuffix("field "+e.Field+" is missing: "+e.Detail, ": ")
		case field.ErrorTypeDuplicate:
			msgs[i] = "field " + e.Field + " is given twice"
		case field.ErrorTypeNotSupported:
			msgs[i] = fmt.Sprintf("field %s: unknown field %q (known: %s)", e.Field, e.BadValue, e.Detail)
		case field.ErrorTypeInternal, field.ErrorTypeTooMany:
			msgs[i] = "field " + e.Field + ": " + e.Detail
		default:
			value := fmt.Sprint(e.BadValue)
			switch v := e.BadValue.(type) {
			case json.RawMessage:
				value = errtext.Value(v)
			case string:
				value = strconv.Quote(v)
			}
			msgs[i] = fmt.Sprintf("field %s: value %s %s", e.Field, value, e.Detail)
		}
	}
	return errors.New(strings.Join(msgs, "; "))
}

// docMarker is a YAML document marker line and what follows it.
var docMarker = regexp.MustCompile(`(?m)^---(.*)$`)

// splitDocuments splits a YAML stream at its document markers the way
// kubectl does: a line that starts with "---" followed by nothing, blanks or
// a comment. YAML does not allow "---" at the start of a line inside a
// document, so this is exact. Documents with nothing but blanks and
// comments are kept (as empty documents) so that numbering follows the file.
func splitDocuments(data []byte) ([][]byte, error) {
	var docs [][]byte
	start := 0
	for _, m := range docMarker.FindAllSubmatchIndex(data, -1) {
		if rest := bytes.TrimSpace(data[m[2]:m[3]]); len(rest) > 0 && rest[0] != '#' {
			return nil, fmt.Errorf("line %d: document marker \"---\" followed by %q: put the document on the next line",
				bytes.Count(data[:m[0]], []byte("\n"))+1, errtext.Value(rest))
		}
		if m[0] > 0 {
			docs = append(docs, data[start:m[0]])
		}
		start = min(m[1]+1, len(data))
	}
	return append(docs, data[start:]), nil
}
