package strictdecode

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

// The field level: JSON into Go types, with errors that name the field path
// (spec.egress[1].except[0]) and the value.

// Fields reads js into v (a pointer to a type with json tags) the way the
// API server does: field names are case-sensitive, and a duplicate or
// unknown field, or a value of the wrong type, is an error. base is js's
// path in its input (nil at the top).
func (d Decoder) Fields(base *field.Path, js []byte, v any) field.ErrorList {
	strict, err := kjson.UnmarshalStrict(js, v)
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &typeErr):
		path, start := locate(json.NewDecoder(bytes.NewReader(js)), js, base, typeErr.Offset)
		var raw json.RawMessage
		_ = json.NewDecoder(bytes.NewReader(js[start:])).Decode(&raw)
		return field.ErrorList{field.TypeInvalid(path, raw, "is not "+d.describe(path, typeErr.Type))}
	case err != nil: // a type's own UnmarshalJSON failed, or js is not JSON
		return field.ErrorList{&field.Error{Type: field.ErrorTypeInternal, Field: base.String(), Detail: err.Error()}}
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

// SplitUnknown splits errs, as Fields gives them, into the paths of the
// fields the type does not have and the other errors. For the objects of
// an API whose newer versions add fields (a controller newer than the
// decoder), an unknown field is not bad input: a Kubernetes client ignores
// it, and the caller names it instead (a warning). A field given twice, or
// a value of the wrong type, stays an error.
func SplitUnknown(errs field.ErrorList) (unknown []string, rest field.ErrorList) {
	for _, e := range errs {
		if e.Type == field.ErrorTypeNotSupported { // only Fields' unknown fields
			unknown = append(unknown, e.Field)
			continue
		}
		rest = append(rest, e)
	}
	return unknown, rest
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
func (d Decoder) describe(path *field.Path, t reflect.Type) string {
	p := path.String()
	name := p[strings.LastIndexByte(p, '.')+1:]
	if h, ok := d.Holds[name]; ok {
		return h
	}
	if base, _, ok := strings.Cut(name, "["); ok && d.Holds[base] != "" {
		return d.Holds[base] // an item of the field
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "a list"
	}
	return "a mapping"
}

// fieldSep is what separates a field name from the next in a path.
var fieldSep = regexp.MustCompile(`^(\[[0-9]+\])*\.`)

// unknownField splits the path of an unknown field in struct t (a path of
// known struct fields, list indices and map keys, then the name, which may
// hold dots) into the fields of the struct that holds it and its name.
func unknownField(t reflect.Type, path string) (known []string, name string) {
	for {
		var next reflect.Type
		var rest string
		known = known[:0]
		for _, f := range reflect.VisibleFields(t) {
			tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if tag == "" || tag == "-" {
				continue
			}
			known = append(known, tag)
			sep := fieldSep.FindString(strings.TrimPrefix(path, tag))
			if !strings.HasPrefix(path, tag) || sep == "" {
				continue
			}
			switch ft := elem(f.Type); {
			case ft.Kind() == reflect.Struct:
				next, rest = ft, path[len(tag)+len(sep):]
			case ft.Kind() == reflect.Map && elem(ft.Elem()).Kind() == reflect.Struct:
				if r, ok := afterMapKey(elem(ft.Elem()), path[len(tag)+len(sep):]); ok {
					next, rest = elem(ft.Elem()), r
				}
			}
		}
		if next == nil {
			return known, path
		}
		t, path = next, rest
	}
}

// afterMapKey is path past the map key it starts with (a key may hold
// dots), the values being of struct t: past the first dot after which a
// field of t, or a last name, follows.
func afterMapKey(t reflect.Type, path string) (string, bool) {
	for i := 0; i < len(path); i++ {
		if path[i] != '.' {
			continue
		}
		rest := path[i+1:]
		if !strings.ContainsAny(rest, ".[") {
			return rest, true
		}
		first := rest[:strings.IndexAny(rest, ".[")]
		for _, f := range reflect.VisibleFields(t) {
			if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag == first {
				return rest, true
			}
		}
	}
	return "", false
}

// elem is the type of the values of t's lists and pointers.
func elem(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	return t
}

// Format writes errs as the docs show them, joined by "; ":
//
//	field spec.egress[1].ports[0].port: value "http" is not an integer
func Format(errs field.ErrorList) error {
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
			msgs[i] = strings.TrimPrefix("field "+e.Field+": "+e.Detail, "field <nil>: ")
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
