package source

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// Fail closed, for ClusterPolicyEndpoints (as recover.go for
// PolicyEndpoints): an object that is not valid keeps its last good version
// (resolveClusters), and while it has none it is replaced by a stand-in made
// of what can be read of it: the pods it names, with no rules. The compiler
// turns a stand-in into "deny everything but the node IP, in both
// directions, at the top of the Admin tier": the tier and priority of a
// stand-in say so (Admin, 0), whatever the object wrote. What is read,
// leniently:
//
//   - metadata.name, for the key; when it cannot be read, the name is
//     "FILE#DOCUMENT" (with ".items[I]" for an item of a list), which no
//     valid object has (a valid name holds no '#');
//   - spec.podSelectorEndpoints[].podIP (and hostIP): each that parses;
//     when the list cannot be read, every "podIP: ADDRESS" of the text;
//   - spec.policyRef.name, for the row.
//
// The kind of a document that cannot be read (not YAML, no kind, a kind of
// neither) is guessed from its text (guessKinds): a stand-in of each kind it
// names, a PolicyEndpoint's when it names neither; and every last good
// object of the file, of either kind, stays.

var (
	// textClusterKind and textPolicyKind find the kinds a document names.
	textClusterKind = regexp.MustCompile(`\bClusterPolicyEndpoint`)
	textPolicyKind  = regexp.MustCompile(`(^|[^A-Za-z0-9_])PolicyEndpoint`)
)

// guessKinds says which kinds a document whose kind cannot be read may be,
// by the kinds its text names: a PolicyEndpoint when it names neither.
func guessKinds(doc []byte) (pe, cpe bool) {
	cpe = textClusterKind.Match(doc)
	pe = textPolicyKind.Match(doc) || !cpe
	return pe, cpe
}

// guessedStandIns are the stand-ins of a document (or file) whose kind
// cannot be read: one of each kind guessKinds gives, named name unless
// their name can be read.
func guessedStandIns(file, name string, doc []byte, cause error) []parsedObject {
	pe, cpe := guessKinds(doc)
	var out []parsedObject
	if pe {
		out = append(out, parsedObject{pe: recoverJSON(file, name, "", doc, cause), err: cause, guessed: true})
	}
	if cpe {
		out = append(out, parsedObject{cpe: recoverClusterJSON(file, name, "", doc, cause), err: cause, guessed: true})
	}
	return out
}

// recoverClusterJSON is the stand-in of a ClusterPolicyEndpoint (its JSON,
// or its text when it is not JSON) that is not valid. name is the name to
// give it when its own cannot be read; key, when not empty, is its name (an
// object of the API server).
func recoverClusterJSON(file, name, key string, js []byte, cause error) *ClusterPolicyEndpoint {
	cpe := &ClusterPolicyEndpoint{File: file, Name: name}
	var obj any
	if json.Unmarshal(js, &obj) != nil {
		cpe.Pods = podsOfText(js)
		return clusterStandIn(cpe, cause)
	}
	m, _ := obj.(map[string]any)
	meta, _ := m["metadata"].(map[string]any)
	if n := str(meta, "name"); validName(n) && !strings.Contains(n, "#") {
		cpe.Name = n
	}
	if key != "" {
		cpe.Name = key
	}
	spec, _ := m["spec"].(map[string]any)
	if ref, _ := spec["policyRef"].(map[string]any); validName(str(ref, "name")) {
		cpe.PolicyRef = str(ref, "name")
	}
	if list, ok := spec["podSelectorEndpoints"].([]any); ok {
		cpe.Pods = podsOfList(list)
	} else {
		cpe.Pods = podsOfText(js)
	}
	return clusterStandIn(cpe, cause)
}

// clusterStandIn marks cpe as the stand-in of an object that is not valid:
// no rules, at the top of the Admin tier, the cause on the row.
func clusterStandIn(cpe *ClusterPolicyEndpoint, cause error) *ClusterPolicyEndpoint {
	cpe.Tier, cpe.Priority = endpoints.TierAdmin, 0
	cpe.Ingress, cpe.Egress = nil, nil
	cpe.Invalid, cpe.StandIn = cause.Error(), true
	cpe.Warnings = []string{fmt.Sprintf("not valid and no last good version: its %d pod IPs are denied everything but their node, in both directions, at the top of the Admin tier, until it is valid",
		len(cpe.Pods))}
	return cpe
}

// nameUnknown says whether a stand-in's name is not its object's.
func (o parsedObject) nameUnknown() bool {
	return o.cpe != nil && strings.Contains(o.cpe.Name, "#")
}

// resolveClusters is the ClusterPolicyEndpoints a file (or an object of the
// API server) puts in force from objs, its objects as read, when some are
// not valid, as resolve is for PolicyEndpoints: each valid object; for a
// name with an invalid copy (or two copies), its last good version in last,
// or else the union of its copies' stand-ins (their pods). When the name or
// the kind of an object cannot be read, every last good object stays.
func resolveClusters(objs []parsedObject, last []*ClusterPolicyEndpoint) []*ClusterPolicyEndpoint {
	lastByName := map[string]*ClusterPolicyEndpoint{}
	for _, cpe := range last {
		lastByName[cpe.Name] = cpe
	}
	var names []string
	copies := map[string][]parsedObject{}
	unknown := false
	for _, o := range objs {
		unknown = unknown || (o.err != nil && (o.guessed || o.nameUnknown()))
		if o.cpe == nil {
			continue
		}
		n := o.cpe.Name
		if copies[n] == nil {
			names = append(names, n)
		}
		copies[n] = append(copies[n], o)
	}
	var out []*ClusterPolicyEndpoint
	for _, n := range names {
		cs := copies[n]
		if len(cs) == 1 && cs[0].err == nil {
			out = append(out, cs[0].cpe)
			continue
		}
		var errs []string
		for _, c := range cs {
			if c.err != nil {
				errs = append(errs, c.err.Error())
			}
		}
		if cpe := lastByName[n]; cpe != nil {
			out = append(out, keptCluster(cpe, strings.Join(errs, "; ")))
			continue
		}
		stand := &ClusterPolicyEndpoint{Name: n, File: cs[0].cpe.File, PolicyRef: cs[0].cpe.PolicyRef}
		for _, c := range cs {
			stand.Pods = append(stand.Pods, c.cpe.Pods...)
		}
		stand.Pods = uniquePods(stand.Pods)
		out = append(out, clusterStandIn(stand, fmt.Errorf("%s", strings.Join(errs, "; "))))
	}
	if unknown {
		for _, cpe := range last {
			if copies[cpe.Name] == nil {
				out = append(out, keptCluster(cpe, "an object of the file cannot be read: it may be this one"))
			}
		}
	}
	return out
}

// keptCluster is a copy of the last good version cpe, kept in force because
// its current version is not valid.
func keptCluster(cpe *ClusterPolicyEndpoint, why string) *ClusterPolicyEndpoint {
	c := *cpe
	c.Invalid = why
	c.Warnings = append(slices.Clone(cpe.Warnings), "not valid now: its last good version stays in force until it is valid")
	return &c
}
