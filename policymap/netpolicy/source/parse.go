package source

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/enimasq/enimasq/cells/errtext"
	"github.com/enimasq/enimasq/cells/strictdecode"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// The API group of every kind, and the kind of a list of objects of any.
const (
	PolicyEndpointAPIVersion = "networking.k8s.aws/v1alpha1"
	listKind                 = "List" // kubectl get -o yaml of several objects
)

// MaxPolicyEndpointFileSize bounds one PolicyEndpoint file.
const MaxPolicyEndpointFileSize = 8 << 20

// parseAll decodes and validates a file, as parsePolicyFile, and returns
// its objects of kind T; one error, of an object of any kind, fails the
// whole file (the source puts in force what parsePolicyFile recovers).
func parseAll[T interface{ Key() string }](path string, data []byte) ([]T, error) {
	objs, err := parsePolicyFile(path, data)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if r, ok := o.row.(T); ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// parsedObject is one object of a file as read, of one of kinds: valid
// (err nil), or the stand-in made of it (recover.go) and its error.
type parsedObject struct {
	kind anyKind
	row  endpoints.Object
	err  error
	// guessed: the object's kind cannot be read; its kind is guessed from
	// its text (guessKinds), and every last good object of the file, of
	// every kind, stays (resolve): it may be one of them.
	guessed bool
	// anonymous: the object's name cannot be read; its stand-in is named
	// by its place in the file ("FILE#DOCUMENT"), and every last good
	// object of its kind in the file stays.
	anonymous bool
}

// parsePolicyFile parses a file object by object, in order: an object that
// is not valid is given as its stand-in, with its error; the error returned
// joins them. Only a file that is too large gives no objects. Each
// document's kind says what it is: an object of one of kinds, or a list of
// them.
func parsePolicyFile(path string, data []byte) ([]parsedObject, error) {
	if len(data) > MaxPolicyEndpointFileSize {
		return nil, fmt.Errorf("%s: file is larger than %d bytes", path, MaxPolicyEndpointFileSize)
	}
	docs, err := strictdecode.Documents(data)
	if err != nil {
		err = fmt.Errorf("%s: %w", path, err)
		return guessedStandIns(path, standInName(path, 1, -1), data, err), err
	}
	var out []parsedObject
	var errs []error
	seen := map[[2]string]string{} // kind, key -> where
	for _, doc := range docs {
		where := path
		if len(docs) > 1 {
			where = fmt.Sprintf("%s: document %d", path, doc.Index)
		}
		for _, o := range parseDocument(path, doc.Index, where, doc.Data) {
			if o.err == nil {
				kind, key := o.kind.kindName(), o.row.Key()
				if first, dup := seen[[2]string{kind, key}]; dup {
					o.err = fmt.Errorf("%s: %s %s is defined twice (first in %s)", where, kind, key, first)
				} else {
					seen[[2]string{kind, key}] = where
				}
			}
			if o.err != nil {
				errs = append(errs, o.err)
			}
			out = append(out, o)
		}
	}
	return out, errors.Join(errs...)
}

// parseDocument parses document n of file (at where): an object of one of
// kinds, or a list of them.
func parseDocument(file string, n int, where string, doc []byte) []parsedObject {
	js, err := strictdecode.ToJSON(doc)
	if err != nil {
		err = fmt.Errorf("%s: not valid YAML or JSON: %w", where, err)
		return guessedStandIns(file, standInName(file, n, -1), doc, err)
	}
	if bytes.Equal(js, []byte("null")) {
		return nil // blank or comments only
	}
	fail := func(err error) []parsedObject {
		err = fmt.Errorf("%s: %w", where, err)
		return guessedStandIns(file, standInName(file, n, -1), js, err)
	}
	if !bytes.HasPrefix(js, []byte("{")) {
		return fail(fmt.Errorf("want %s, got %s", documentWants(), errtext.Value(js)))
	}
	wrap := func(err error) error { return fmt.Errorf("%s: %w", where, err) }
	kind := kindOf(js)
	if k := kindNamed(kind); k != nil {
		return []parsedObject{k.parse(file, nil, js, wrap, standInName(file, n, -1), false)}
	}
	if items := listOf(kind); items != nil || kind == listKind {
		var list objectList
		if errs := policyDecoder.Fields(nil, js, &list); len(errs) > 0 {
			return fail(strictdecode.Format(errs))
		}
		out := make([]parsedObject, 0, len(list.Items))
		for i, item := range list.Items {
			k := items
			if k == nil {
				k = kindNamed(kindOf(item))
			}
			out = append(out, parseItem(file, field.NewPath("items").Index(i), k, item, wrap, standInName(file, n, i)))
		}
		return out
	}
	if kind == nil || kind == "" {
		return fail(strictdecode.Format(field.ErrorList{field.Required(field.NewPath("kind"), "want "+documentKinds())}))
	}
	return fail(strictdecode.Format(field.ErrorList{field.Invalid(field.NewPath("kind"), kind, "is not "+documentKinds())}))
}

// kindOf is the kind of an object (its JSON), as decoded: nil when it has
// none or is not an object.
func kindOf(js []byte) any {
	var head struct {
		Kind any `json:"kind"`
	}
	_ = json.Unmarshal(js, &head) // an object: the kind is checked by the caller
	return head.Kind
}

// parseItem parses an item of a list at base (items[i]) as of kind k, or,
// when k is nil (its kind is none of kinds), as what its text suggests
// (guessKinds), which then reports the kind; an error is wrapped by wrap.
// An object that is not valid gives its stand-in, named name when its own
// name cannot be read.
func parseItem(file string, base *field.Path, k anyKind, js []byte, wrap func(error) error, name string) parsedObject {
	guessed := k == nil
	if guessed {
		k = guessKinds(js)[0]
	}
	return k.parse(file, base, js, wrap, name, guessed)
}

// decodeObject decodes an object of any kind at base into obj, as a
// Kubernetes client does: a field its type does not have (a newer
// controller's, as spec.subject of v1.1.10's ClusterPolicyEndpoints) is
// not an error but returned by its path, for the source to name; a field
// given twice or a value of the wrong type is an error.
func decodeObject(base *field.Path, js []byte, obj any) (unknown []string, errs field.ErrorList) {
	return strictdecode.SplitUnknown(policyDecoder.Fields(base, js, obj))
}

// objectValidator validates one kind's object, decoded into its wire
// shape W: its header (apiVersion, kind, metadata), then its spec, into
// its row.
type objectValidator[W any, T endpoints.Object] interface {
	common() *validator
	header(base *field.Path, obj *W)
	spec(path *field.Path, obj *W)
	row() T
}

// decodeWith decodes an object at base into its wire shape W and
// validates it with v. Errors past the header name the object (its key).
func decodeWith[W any, T endpoints.Object](base *field.Path, js []byte, v objectValidator[W, T]) (T, error) {
	var obj W
	var zero T
	unknown, errs := decodeObject(base, js, &obj)
	c := v.common()
	if v.header(base, &obj); len(c.errs) > 0 {
		if len(errs) == 0 {
			errs = c.errs
		}
		return zero, strictdecode.Format(errs)
	}
	if len(errs) == 0 {
		v.spec(base.Child("spec"), &obj)
		errs = c.errs
	}
	o := v.row()
	if len(errs) > 0 {
		return zero, fmt.Errorf("%s: %w", o.Key(), strictdecode.Format(errs))
	}
	fields := o.Common()
	*fields.Warnings, *fields.Unknown = c.warnings, unknown
	return o, nil
}

// policyDecoder decodes objects strictly; the errors of a value of the
// wrong type say what these fields hold.
var policyDecoder = strictdecode.Decoder{Holds: map[string]string{
	"podIsolation": "a list of policy types (Ingress, Egress)",
	"except":       "a list of CIDRs",
}}
