package source

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/enimasq/enimasq/bpf"
)

// Fail closed, for every kind. An object that is not valid never leaves a
// pod more open than before: its last good version stays (resolve), and
// while it has none it is replaced by a stand-in made of what can be read
// of it (recover): the pods it names, with no rules, and what its kind
// reads leniently (kind.lenient: its key, the directions a PolicyEndpoint
// isolates), which its kind makes deny everything but their node
// (kind.failClosed). The pods read, leniently, are
// spec.podSelectorEndpoints[].podIP (and hostIP): each that parses; when
// the list cannot be read, every "podIP: ADDRESS" of the document's text.
// A document that is not YAML or JSON is read by its text only.
//
// The kind of a document that cannot be read (not YAML, no kind, a kind of
// none of kinds) is guessed from its text (guessKinds): a stand-in of each
// kind it names, the first kind's when it names none; and every last good
// object of the file, of every kind, stays.

// textPodIP finds the pod IPs of a document that cannot be decoded.
var textPodIP = regexp.MustCompile(`["']?\bpodIP["']?\s*:\s*["']?([0-9A-Fa-f:.]+)`)

// standInName is the name of the stand-in of an object whose name cannot be
// read: document n of file, item item of its list (-1: not in a list).
func standInName(file string, n, item int) string {
	name := fmt.Sprintf("%s#%d", filepath.Base(file), n)
	if item >= 0 {
		name += fmt.Sprintf(".items[%d]", item)
	}
	return name
}

// guessKinds says which kinds a document whose kind cannot be read may be,
// by the kinds its text names: the first of kinds when it names none.
func guessKinds(doc []byte) []anyKind {
	var out []anyKind
	for _, k := range kinds {
		if k.mentionedIn(doc) {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return kinds[:1]
	}
	return out
}

// guessedStandIns are the stand-ins of a document (or file) whose kind
// cannot be read: one of each kind guessKinds gives, named name unless
// their name can be read.
func guessedStandIns(file, name string, doc []byte, cause error) []parsedObject {
	var out []parsedObject
	for _, k := range guessKinds(doc) {
		out = append(out, k.guess(file, name, doc, cause))
	}
	return out
}

// standInObject is the stand-in of an object of file (its JSON, or its
// text) that is not valid, as read.
func (k *kind[R, T]) standInObject(file, name string, js []byte, cause error, guessed bool) parsedObject {
	o, anonymous := k.recover(file, name, "", js, cause)
	return parsedObject{kind: k, row: o, err: cause, guessed: guessed, anonymous: anonymous}
}

// recover is the stand-in of an object (its JSON, or its text when it is
// not JSON) that is not valid. name is the name to give it when its own
// cannot be read (then anonymous); key, when not empty, is its key (an
// object of the API server).
func (k *kind[R, T]) recover(file, name, key string, js []byte, cause error) (o T, anonymous bool) {
	var obj any
	if json.Unmarshal(js, &obj) != nil {
		obj, key = nil, "" // read by its text only
	}
	m, _ := obj.(map[string]any)
	meta, _ := m["metadata"].(map[string]any)
	spec, _ := m["spec"].(map[string]any)
	o = k.lenient(file, name, key, meta, spec)
	if list, ok := spec["podSelectorEndpoints"].([]any); ok {
		*o.Common().Pods = podsOfList(list)
	} else {
		*o.Common().Pods = podsOfText(js)
	}
	return k.standIn(o, cause), key == "" && o.Key() == name
}

// standIn marks o as the stand-in of an object that is not valid: no
// rules (its kind's failClosed), the cause on the row.
func (k *kind[R, T]) standIn(o T, cause error) T {
	what := k.failClosed(o)
	c := o.Common()
	*c.Invalid, *c.StandIn = cause.Error(), true
	*c.Warnings = []string{fmt.Sprintf("not valid and no last good version: its %d pod IPs are %s, until it is valid", len(*c.Pods), what)}
	return o
}

// podsOfList reads podSelectorEndpoints: the entries whose podIP parses,
// with their hostIP when it parses and is of the pod IP's family.
func podsOfList(list []any) []PodEndpoint {
	var out []PodEndpoint
	for _, item := range list {
		m, _ := item.(map[string]any)
		ep := PodEndpoint{PodIP: lenientAddr(str(m, "podIP")), Name: str(m, "name"), Namespace: str(m, "namespace")}
		if !ep.PodIP.IsValid() {
			continue
		}
		if h := lenientAddr(str(m, "hostIP")); h.IsValid() && bpf.FamilyOf(h) == bpf.FamilyOf(ep.PodIP) {
			ep.HostIP = h
		}
		out = append(out, ep)
	}
	return uniquePods(out)
}

// podsOfText finds "podIP: ADDRESS" in a document's text.
func podsOfText(doc []byte) []PodEndpoint {
	var out []PodEndpoint
	for _, m := range textPodIP.FindAllSubmatch(doc, -1) {
		if a := lenientAddr(string(m[1])); a.IsValid() {
			out = append(out, PodEndpoint{PodIP: a})
		}
	}
	return uniquePods(out)
}

// uniquePods keeps the first entry of each pod IP.
func uniquePods(pods []PodEndpoint) []PodEndpoint {
	seen := map[netip.Addr]bool{}
	return slices.DeleteFunc(pods, func(p PodEndpoint) bool {
		dup := seen[p.PodIP]
		seen[p.PodIP] = true
		return dup
	})
}

// lenientAddr is s as an address the validator would accept, or invalid.
func lenientAddr(s string) netip.Addr {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil || a.Is4In6() || a.Zone() != "" {
		return netip.Addr{}
	}
	return a
}

func str(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

func validName(s string) bool {
	return s != "" && len(s) <= maxNameLength && !strings.ContainsAny(s, "/ \t\r\n")
}

// resolve is the objects of the kind a file (or an object of the API
// server) puts in force from objs, its objects as read, when some are not
// valid: each valid object; for a key with an invalid copy (or two
// copies), its last good version in last, or else the union of its
// copies' stand-ins (their pods, and what the kind joins). When the key of
// an object of the kind cannot be read, or the kind of one (it may be of
// this kind), every last good object stays: it may be that one.
func (k *kind[R, T]) resolve(objs []parsedObject, last []T) []T {
	lastByKey := map[string]T{}
	for _, o := range last {
		lastByKey[o.Key()] = o
	}
	var keys []string
	copies := map[string][]parsedObject{}
	unknownKey := false
	for _, o := range objs {
		unknownKey = unknownKey || (o.err != nil && o.guessed)
		if _, ok := o.row.(T); !ok {
			continue
		}
		key := o.row.Key()
		if copies[key] == nil {
			keys = append(keys, key)
		}
		copies[key] = append(copies[key], o)
		unknownKey = unknownKey || (o.err != nil && o.anonymous)
	}
	var out []T
	for _, key := range keys {
		cs := copies[key]
		if len(cs) == 1 && cs[0].err == nil {
			out = append(out, rowOf[T](cs[0]))
			continue
		}
		var errs []string
		for _, c := range cs {
			if c.err != nil {
				errs = append(errs, c.err.Error())
			}
		}
		if o, ok := lastByKey[key]; ok {
			out = append(out, kept(o, strings.Join(errs, "; ")))
			continue
		}
		out = append(out, k.union(cs, strings.Join(errs, "; ")))
	}
	if unknownKey {
		for _, o := range last {
			if copies[o.Key()] == nil {
				out = append(out, kept(o, "an object of the file cannot be read: it may be this one"))
			}
		}
	}
	return out
}

// kept is a copy of the last good version o, kept in force because its
// current version is not valid.
func kept[R any, T row[R]](o T, why string) T {
	c := withWarnings(o, "not valid now: its last good version stays in force until it is valid")
	*c.Common().Invalid = why
	return c
}

// union is the stand-in of a key from all its copies: the first's
// identity, their pods, and what the kind joins of each.
func (k *kind[R, T]) union(cs []parsedObject, why string) T {
	c := *rowOf[T](cs[0])
	stand := T(&c)
	fields := stand.Common()
	*fields.Pods, *fields.Unknown = nil, nil
	for _, o := range cs {
		r := rowOf[T](o)
		*fields.Pods = append(*fields.Pods, r.PodEntries()...)
		if k.join != nil {
			k.join(stand, r)
		}
	}
	*fields.Pods = uniquePods(*fields.Pods)
	return k.standIn(stand, fmt.Errorf("%s", why))
}
