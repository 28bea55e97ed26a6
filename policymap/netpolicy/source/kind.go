package source

import (
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/enimasq/enimasq/cells/nodeconfig"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// row is a kind's row type T, a pointer to its struct R: the code written
// once for every kind copies rows (a last good version kept with its
// error, a row with this node's warnings) without knowing their type.
type row[R any] interface {
	*R
	endpoints.Object
}

// kind is one kind of object, as the code written once for every kind
// needs it: the file and document parser (parse.go), the fail-closed
// recovery (recover.go), the directory source (source.go, files.go,
// table.go) and the API source (source_k8s.go). What differs between
// kinds is what their objects mean: how one is decoded and validated,
// what a stand-in keeps of one that is not valid and what it denies, and
// what of a row this node does not program. Each kind is one value of
// this type (kind_pe.go, kind_cpe.go), in kinds.
type kind[R any, T row[R]] struct {
	// name is the kind ("PolicyEndpoint"), list the kind of a list of
	// them ("PolicyEndpointList").
	name, list string
	// named finds the kind named in the text of a document whose kind
	// cannot be read (guessKinds).
	named *regexp.Regexp
	// resource is the kind's API resource; namespaced, whether its
	// objects are (their key is "namespace/name", else "name").
	resource   schema.GroupVersionResource
	namespaced bool
	// optionalCRD: the API server may not serve the resource (its CRD is
	// not installed); while no object was ever seen, that is no objects.
	optionalCRD bool
	// scope is the health scope, below the source's job, the kind reports
	// on ("" the job's own).
	scope string
	// fate is what a stand-in does to its pods, as the failure texts say
	// it ("isolated").
	fate string
	// table is the kind's table (package endpoints).
	table endpoints.Kind[T]

	// decode decodes and validates one object at base (the top level, or
	// items[i] of a list) of file.
	decode func(file string, base *field.Path, js []byte) (T, error)
	// lenient is what a stand-in reads of an object that is not valid,
	// besides its pods (recover): its name (name when its own cannot be
	// read; key when not empty, the key of an object of the API server)
	// and what the kind reads of metadata and spec (nil when the object
	// cannot be decoded).
	lenient func(file, name, key string, meta, spec map[string]any) T
	// failClosed clears what a stand-in allows and says what its pods are
	// then ("isolated in Egress, allowing nothing but their node").
	failClosed func(T) string
	// join adds to the stand-in of a key what one of its copies adds to
	// it besides its pods (nil: nothing).
	join func(stand, copy T)
	// forNode is a row as this node programs it, what it does not
	// program named in its warnings (on a copy).
	forNode func(T, nodeconfig.Config) T
}

// anyKind is a kind with its row type erased, for the parser, which reads
// every kind from one file.
type anyKind interface {
	kindName() string
	listName() string
	// mentionedIn says whether a document's text names the kind.
	mentionedIn(doc []byte) bool
	// parse decodes and validates an object of the kind: a stand-in,
	// named name unless its own name can be read, with its error wrapped
	// by wrap, when it is not valid.
	parse(file string, base *field.Path, js []byte, wrap func(error) error, name string, guessed bool) parsedObject
	// guess is the stand-in of a document of the kind that cannot be
	// read.
	guess(file, name string, doc []byte, cause error) parsedObject
}

// kinds are the kinds of objects a file may hold: the first is the guess
// for a document whose text names none.
var kinds = []anyKind{policyEndpoints, clusterPolicyEndpoints}

func (k *kind[R, T]) kindName() string            { return k.name }
func (k *kind[R, T]) listName() string            { return k.list }
func (k *kind[R, T]) mentionedIn(doc []byte) bool { return k.named.Match(doc) }
func (k *kind[R, T]) plural() string              { return k.name + "s" }
func (k *kind[R, T]) apiFile(key string) string   { return k.resource.Resource + "/" + key }

func (k *kind[R, T]) parse(file string, base *field.Path, js []byte, wrap func(error) error, name string, guessed bool) parsedObject {
	o, err := k.decode(file, base, js)
	if err != nil {
		err = wrap(err)
		return k.standInObject(file, name, js, err, guessed)
	}
	return parsedObject{kind: k, row: o, guessed: guessed}
}

func (k *kind[R, T]) guess(file, name string, doc []byte, cause error) parsedObject {
	return k.standInObject(file, name, doc, cause, true)
}

// rowOf is o's row if it is of kind T (else the zero T).
func rowOf[T endpoints.Object](o parsedObject) T {
	r, _ := o.row.(T)
	return r
}

// withWarnings is a copy of o with more warnings.
func withWarnings[R any, T row[R]](o T, more ...string) T {
	c := *o
	p := T(&c)
	w := p.Common().Warnings
	*w = append(slices.Clone(*w), more...)
	return p
}

// kindList names kinds as an error does: "A, B or C".
func kindList(names []string) string {
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// documentKinds are the kinds of a document, as the parser names them in
// an error: each kind, each list kind, or a List.
func documentKinds() string {
	var names []string
	for _, k := range kinds {
		names = append(names, k.kindName())
	}
	for _, k := range kinds {
		names = append(names, k.listName())
	}
	return kindList(append(names, listKind))
}

// documentWants is what a document must be, as the parser says it when it
// is not an object: "a PolicyEndpoint, ... or a List".
func documentWants() string {
	var names []string
	for _, k := range kinds {
		names = append(names, "a "+k.kindName())
	}
	return kindList(append(names, "a "+listKind))
}

// kindNamed is the kind named kind (nil: none).
func kindNamed(kind any) anyKind {
	for _, k := range kinds {
		if kind == k.kindName() {
			return k
		}
	}
	return nil
}

// listOf is the kind of the items of a list of kind kind (nil: a List, of
// any kind, or not a list).
func listOf(kind any) anyKind {
	for _, k := range kinds {
		if kind == k.listName() {
			return k
		}
	}
	return nil
}
