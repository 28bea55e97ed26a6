package compile

import (
	"encoding/binary"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// Interned map values: the entries of many prefixes share one value per port cover.

// The values every template uses.
var (
	denyPorts = newPortValue(policybpf.AllowValue())
	anyPorts  = newPortValue(policybpf.AllowValue(policybpf.AnyPortEntry))
	// notIsolated is the root value of a direction that no selecting
	// object isolates: the NetworkPolicy decides nothing there, the
	// Baseline tier and the default do.
	notIsolated = newPortValue(&policybpf.PolicyValue{NotIsolated: true})
)

// newPortValue encodes a value. Values are built from sorted, merged port
// entries: they always encode.
func newPortValue(v *policybpf.PolicyValue) *portValue {
	b, chunks, err := v.Encode()
	if err != nil {
		return &portValue{bytes: make([]byte, policybpf.PolicyValueSize), text: "deny", err: err.Error()}
	}
	return &portValue{bytes: b, chunks: chunks, text: v.String()}
}

// valueInterner shares the values of a template: a value seen before
// costs no allocation.
type valueInterner struct {
	scratch []policybpf.PortEntry
	key     []byte
	seen    map[string]*portValue
}

func newValueInterner() *valueInterner {
	return &valueInterner{seen: map[string]*portValue{}}
}

// value returns the value of the live ports, whatever their number: the
// intervals past a map value's go in chunks (policybpf.PolicyValue).
func (v *valueInterner) value(cover *portCover) *portValue {
	if cover.count() == 0 {
		return denyPorts
	}
	v.scratch = cover.appendEntries(v.scratch[:0])
	v.key = v.key[:0]
	for _, e := range v.scratch {
		v.key = binary.LittleEndian.AppendUint32(v.key, e.Protocol)
		v.key = binary.LittleEndian.AppendUint32(v.key, e.StartPort)
		v.key = binary.LittleEndian.AppendUint32(v.key, e.EndPort)
	}
	if pv, ok := v.seen[string(v.key)]; ok {
		return pv
	}
	pv := newPortValue(policybpf.AllowValue(v.scratch...))
	v.seen[string(v.key)] = pv
	return pv
}
