package strictdecode

// The flat reader: a mapping of scalars and lists of strings (the
// ip-masq-agent file) straight into the struct, without JSON.

import (
	"bytes"
	"reflect"
	"strconv"
	"strings"
	"sync"
)

// flatField is a field of a struct the flat reader can set.
type flatField struct {
	name  string // the json name
	index int
	kind  reflect.Kind // of the value; Invalid: not settable by the flat reader
	ptr   bool         // the field points to its value
}

// flatTypes caches the fields of the struct types decoded.
var flatTypes sync.Map // reflect.Type -> []flatField

// flatFields are the json-tagged fields of struct t.
func flatFields(t reflect.Type) []flatField {
	if fs, ok := flatTypes.Load(t); ok {
		return fs.([]flatField)
	}
	var fs []flatField
	for i := range t.NumField() {
		sf := t.Field(i)
		tag, opts, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if !sf.IsExported() || tag == "" || tag == "-" {
			continue
		}
		f := flatField{name: tag, index: i}
		ft := sf.Type
		if ft.Kind() == reflect.Pointer {
			f.ptr, ft = true, ft.Elem()
		}
		switch k := ft.Kind(); {
		case strings.Contains(opts, "string"):
			// ",string": the JSON path's
		case ft == reflect.TypeFor[[]string]() && !f.ptr:
			f.kind = k
		case ft.PkgPath() != "" || ft.Name() != k.String():
			// a named type, which may decode itself: the JSON path's
		case k == reflect.String, k == reflect.Bool, k >= reflect.Int && k <= reflect.Uint64:
			f.kind = k
		}
		fs = append(fs, f)
	}
	flatTypes.Store(t, fs)
	return fs
}

// decodeFlat is the flat reader: it sets *v (a struct) from data when data
// is a mapping of the rule set whose keys are v's json names, spelt
// exactly, each once, and whose values are of its fields' types: a
// string, a whole number, true or false on the key's line, or a block list
// of strings (or []) below it; a key with nothing is null. false, and v
// untouched, for anything else.
func decodeFlat(data []byte, v any) bool {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return false
	}
	fields := flatFields(rv.Elem().Type())
	if len(fields) > 64 {
		return false
	}
	tmp := reflect.New(rv.Elem().Type()).Elem()
	var seen uint64 // by index in fields
	lex := newLexer(data)
	line, more := lex.next()
	if !more {
		return false // empty, or outside the rule set
	}
	for more {
		if line.indent != 0 {
			return false
		}
		key, value, ok := splitKey(line.text)
		if !ok {
			return false
		}
		f := -1
		for i := range fields {
			if fields[i].name == key {
				f = i
			}
		}
		if f < 0 || seen&(1<<f) != 0 || fields[f].kind == reflect.Invalid {
			return false
		}
		seen |= 1 << f
		field := fields[f]
		fv := tmp.Field(field.index)
		line, more = lex.next()
		if value != "" {
			if !setScalar(fv, field, value) {
				return false
			}
			continue
		}
		if !more || !isItem(line.text) {
			continue // null: the zero value
		}
		if field.kind != reflect.Slice {
			return false
		}
		items := make([]string, 0, bytes.Count(data, []byte{'\n'}))
		for inset := line.indent; more && line.indent == inset && isItem(line.text); line, more = lex.next() {
			item := line.text[1:]
			for item != "" && item[0] == ' ' {
				item = item[1:]
			}
			switch scalar(item) {
			case stringValue:
				items = append(items, item)
			case quotedValue:
				items = append(items, item[1:len(item)-1])
			default:
				return false
			}
		}
		fv.Set(reflect.ValueOf(items))
	}
	if lex.bad {
		return false
	}
	out := rv.Elem()
	for i, f := range fields {
		if seen&(1<<i) != 0 {
			out.Field(f.index).Set(tmp.Field(f.index))
		}
	}
	return true
}

// setScalar sets fv, of field, to the scalar s; false if s is not of its
// type.
func setScalar(fv reflect.Value, field flatField, s string) bool {
	k := scalar(s)
	if k == emptyList && field.kind == reflect.Slice {
		fv.Set(reflect.ValueOf([]string{}))
		return true
	}
	if field.ptr {
		p := reflect.New(fv.Type().Elem())
		fv.Set(p)
		fv = p.Elem()
	}
	switch {
	case field.kind == reflect.String && (k == stringValue || k == quotedValue):
		if k == quotedValue {
			s = s[1 : len(s)-1]
		}
		fv.SetString(s)
	case field.kind == reflect.Bool && k == boolValue:
		fv.SetBool(s == "true")
	case field.kind >= reflect.Int && field.kind <= reflect.Int64 && k == intValue:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || fv.OverflowInt(n) {
			return false
		}
		fv.SetInt(n)
	case field.kind >= reflect.Uint && field.kind <= reflect.Uint64 && k == intValue:
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || fv.OverflowUint(n) {
			return false
		}
		fv.SetUint(n)
	default:
		return false
	}
	return true
}
