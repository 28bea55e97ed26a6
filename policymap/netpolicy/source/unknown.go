package source

import (
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/cells/metrics"
)

// Fields enimasq does not know. A controller newer than enimasq's types
// writes fields they do not have (v1.1.10 writes spec.subject on every
// ClusterPolicyEndpoint, which the AWS agent v1.5.0's types lack too). A
// Kubernetes client ignores them, and so does the decoder (decodeObject);
// what it does not know it names: on the object's row, in the log once per
// object and field, in the health text, and in
// enimasq_policy_unknown_fields_total.

// maxUnknownFieldLabels bounds the field label values of the metric: a file
// may name any number of fields; past the bound they count as "other".
const maxUnknownFieldLabels = 64

// unknownFields names the unknown fields of one kind's objects.
type unknownFields struct {
	kind    string
	counter *prometheus.CounterVec

	mu     sync.Mutex
	seen   map[string][]string // object key -> its unknown fields, as last logged
	labels map[string]bool     // field label values in use
}

func newUnknownFields(kind string, counter *prometheus.CounterVec) *unknownFields {
	return &unknownFields{kind: kind, counter: counter, seen: map[string][]string{}, labels: map[string]bool{}}
}

// note takes the unknown fields of every object in force (by key): an
// object's field not seen before on it is logged and counted; objects gone
// are forgotten. It returns the health text ("" when there is none). A nil
// u names nothing.
func (u *unknownFields) note(log *slog.Logger, unknown map[string][]string) string {
	if u == nil {
		return ""
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for key := range u.seen {
		if _, ok := unknown[key]; !ok {
			delete(u.seen, key)
		}
	}
	objects := map[string]int{} // field label -> objects
	for _, key := range slices.Sorted(maps.Keys(unknown)) {
		fields := unknown[key]
		if len(fields) == 0 {
			delete(u.seen, key)
			continue
		}
		for _, f := range fields {
			label := u.label(f)
			objects[label]++
			if slices.Contains(u.seen[key], f) {
				continue
			}
			log.Warn(u.kind+" has a field enimasq does not know: ignored, as a Kubernetes client ignores it (a newer controller's?)",
				"object", key, "field", f)
			if c, err := u.counter.GetMetricWithLabelValues(u.kind, label); err == nil {
				c.Inc()
			}
		}
		u.seen[key] = slices.Clone(fields)
	}
	if len(objects) == 0 {
		return ""
	}
	var parts []string
	for _, label := range slices.Sorted(maps.Keys(objects)) {
		parts = append(parts, fmt.Sprintf("%s (%d objects)", label, objects[label]))
	}
	return "; fields enimasq does not know, ignored: " + strings.Join(parts, ", ")
}

// listIndex is a list index in a field path.
var listIndex = regexp.MustCompile(`\[[0-9]+\]`)

// maxFieldLabel bounds the bytes of a field label value.
const maxFieldLabel = 128

// label is a field's label value: its path within the object, without list
// indices (items[3].spec.ingress[2].x is spec.ingress[].x), from a bounded
// set.
func (u *unknownFields) label(field string) string {
	if strings.HasPrefix(field, "items[") {
		if _, rest, ok := strings.Cut(field, "]."); ok {
			field = rest
		}
	}
	field = listIndex.ReplaceAllString(field, "[]")
	if len(field) > maxFieldLabel {
		// Cut on a character boundary: a label value must be UTF-8.
		cut := maxFieldLabel
		for cut > 0 && !utf8.RuneStart(field[cut]) {
			cut--
		}
		field = field[:cut]
	}
	field = strings.ToValidUTF8(field, "?")
	if !u.labels[field] {
		if len(u.labels) >= maxUnknownFieldLabels {
			return "other"
		}
		u.labels[field] = true
	}
	return field
}

// newUnknownFieldsCounter is enimasq_policy_unknown_fields_total.
func newUnknownFieldsCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metrics.Namespace,
		Name:      "policy_unknown_fields_total",
		Help:      "Fields of PolicyEndpoints and ClusterPolicyEndpoints that enimasq does not know, ignored: counted once per object and field (kind, field path without list indices).",
	}, []string{"kind", "field"})
}
