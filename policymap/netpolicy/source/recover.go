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

// Fail closed. An object that is not valid never leaves a pod more open
// than before: its last good version stays (resolve), and while it has none
// it is replaced by a stand-in made of what can be read of it (recover): the
// pods it names, isolated in the directions it names, with no rules, so
// they are denied everything in those directions but their node (kubelet
// probes, when the hostIP can be read). What is read, leniently:
//
//   - metadata.name and namespace, for the key; when they cannot be read,
//     the key is "FILE#DOCUMENT" (with ".items[I]" for an item of a list),
//     which no valid object has (a valid key holds a '/');
//   - spec.podSelectorEndpoints[].podIP (and hostIP): each that parses;
//     when the list cannot be read, every "podIP: ADDRESS" of the
//     document's text;
//   - spec.podIsolation: the directions listed; both when it is missing, is
//     not a list, or lists anything else;
//   - spec.policyRef, for the row.
//
// A document that is not YAML or JSON is read by its text only: its podIPs,
// both directions.

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

// recoverText is the stand-in of a document that cannot be decoded.
func recoverText(file, name string, doc []byte, cause error) *PolicyEndpoint {
	pe := &PolicyEndpoint{File: file, Name: name, IsolatesIngress: true, IsolatesEgress: true}
	pe.Pods = podsOfText(doc)
	return standIn(pe, cause)
}

// recoverJSON is the stand-in of an object (its JSON) that is not valid.
// name is the name to give it when its own cannot be read; key, when not
// empty, is its key (an object of the API server).
func recoverJSON(file, name, key string, js []byte, cause error) *PolicyEndpoint {
	var obj any
	if json.Unmarshal(js, &obj) != nil {
		return recoverText(file, name, js, cause)
	}
	m, _ := obj.(map[string]any)
	pe := &PolicyEndpoint{File: file, Name: name}
	meta, _ := m["metadata"].(map[string]any)
	if ns, n := str(meta, "namespace"), str(meta, "name"); validName(ns) && validName(n) {
		pe.Namespace, pe.Name = ns, n
	}
	if ns, n, ok := strings.Cut(key, "/"); ok {
		pe.Namespace, pe.Name = ns, n
	}
	spec, _ := m["spec"].(map[string]any)
	if ref, _ := spec["policyRef"].(map[string]any); str(ref, "name") != "" {
		ns := str(ref, "namespace")
		if ns == "" {
			ns = pe.Namespace
		}
		pe.PolicyRef = ns + "/" + str(ref, "name")
	}
	pe.IsolatesIngress, pe.IsolatesEgress = isolationOf(spec["podIsolation"])
	if list, ok := spec["podSelectorEndpoints"].([]any); ok {
		pe.Pods = podsOfList(list)
	} else {
		pe.Pods = podsOfText(js)
	}
	return standIn(pe, cause)
}

// isolationOf reads podIsolation: both directions unless it is a list of
// Ingress and Egress only.
func isolationOf(v any) (ingress, egress bool) {
	list, ok := v.([]any)
	if !ok {
		return true, true
	}
	for _, t := range list {
		switch t {
		case "Ingress":
			ingress = true
		case "Egress":
			egress = true
		default:
			return true, true
		}
	}
	return ingress, egress
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

// standIn marks pe as the stand-in of an object that is not valid: no
// rules, the cause on the row.
func standIn(pe *PolicyEndpoint, cause error) *PolicyEndpoint {
	pe.Ingress, pe.Egress = nil, nil
	pe.Invalid, pe.StandIn = cause.Error(), true
	pe.Warnings = []string{fmt.Sprintf("not valid and no last good version: its %d pod IPs are isolated in %s, allowing nothing but their node, until it is valid",
		len(pe.Pods), pe.Isolation())}
	return pe
}

// resolve is the PolicyEndpoints a file (or an object of the API server)
// puts in force from objs, its objects as read, when some are not valid:
// each valid object; for a key with an invalid copy (or two copies), its
// last good version in last, or else the union of its copies' stand-ins
// (pods and isolation). When the key of an object cannot be read, or the
// kind of one (it may be a PolicyEndpoint), every last good object stays:
// it may be that one. The ClusterPolicyEndpoints of objs are
// resolveClusters'.
func resolve(objs []parsedObject, last []*PolicyEndpoint) []*PolicyEndpoint {
	lastByKey := map[string]*PolicyEndpoint{}
	for _, pe := range last {
		lastByKey[pe.Key()] = pe
	}
	var keys []string
	copies := map[string][]parsedObject{}
	unknownKey := false
	for _, o := range objs {
		unknownKey = unknownKey || (o.err != nil && o.guessed)
		if o.pe == nil {
			continue
		}
		k := o.pe.Key()
		if copies[k] == nil {
			keys = append(keys, k)
		}
		copies[k] = append(copies[k], o)
		unknownKey = unknownKey || (o.err != nil && o.pe.Namespace == "")
	}
	var out []*PolicyEndpoint
	for _, k := range keys {
		cs := copies[k]
		if len(cs) == 1 && cs[0].err == nil {
			out = append(out, cs[0].pe)
			continue
		}
		var errs []string
		for _, c := range cs {
			if c.err != nil {
				errs = append(errs, c.err.Error())
			}
		}
		if pe := lastByKey[k]; pe != nil {
			out = append(out, kept(pe, strings.Join(errs, "; ")))
			continue
		}
		out = append(out, unionStandIn(cs, strings.Join(errs, "; ")))
	}
	if unknownKey {
		for _, pe := range last {
			if copies[pe.Key()] == nil {
				out = append(out, kept(pe, "an object of the file cannot be read: it may be this one"))
			}
		}
	}
	return out
}

// kept is a copy of the last good version pe, kept in force because its
// current version is not valid.
func kept(pe *PolicyEndpoint, why string) *PolicyEndpoint {
	c := *pe
	c.Invalid = why
	c.Warnings = append(slices.Clone(pe.Warnings), "not valid now: its last good version stays in force until it is valid")
	return &c
}

// unionStandIn is the stand-in of a key from all its copies: their pods
// and the directions any of them isolates.
func unionStandIn(cs []parsedObject, why string) *PolicyEndpoint {
	pe := &PolicyEndpoint{Namespace: cs[0].pe.Namespace, Name: cs[0].pe.Name, File: cs[0].pe.File, PolicyRef: cs[0].pe.PolicyRef}
	for _, c := range cs {
		pe.Pods = append(pe.Pods, c.pe.Pods...)
		pe.IsolatesIngress = pe.IsolatesIngress || c.pe.IsolatesIngress
		pe.IsolatesEgress = pe.IsolatesEgress || c.pe.IsolatesEgress
	}
	pe.Pods = uniquePods(pe.Pods)
	return standIn(pe, fmt.Errorf("%s", why))
}

// oneLine joins errors (nested errors.Join included) with "; ", so that
// health names every bad input on one line; errors.Is and As still see
// each.
type oneLine []error

func joinErrors(err error) error {
	var out oneLine
	var flatten func(error)
	flatten = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				flatten(e)
			}
			return
		}
		if err != nil {
			out = append(out, err)
		}
	}
	flatten(err)
	if len(out) == 0 {
		return nil
	}
	return out
}

func (e oneLine) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e oneLine) Unwrap() []error { return e }
