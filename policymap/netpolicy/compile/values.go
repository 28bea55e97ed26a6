package compile

import (
	"encoding/binary"
	"fmt"

	"github.com/enimasq/enimasq/bpf"
)

// Interned map values: the entries of many prefixes share one value per port cover.

// The values every template uses.
var (
	denyPorts = newPortValue(bpf.PolicyValue{}, "")
	anyPorts  = newPortValue(bpf.PolicyValue{bpf.AnyPortEntry}, "")
)

func newPortValue(v bpf.PolicyValue, err string) *portValue {
	b, _ := v.MarshalBinary() // a fixed-size array: never fails
	return &portValue{bytes: b, text: v.String(), err: err}
}

// valueInterner shares the values of a template: a value seen before
// costs no allocation.
type valueInterner struct {
	scratch []bpf.PortEntry
	key     []byte
	seen    map[string]*portValue
}

func newValueInterner() *valueInterner {
	return &valueInterner{seen: map[string]*portValue{}}
}

// value returns the value of the live ports.
func (v *valueInterner) value(cover *portCover) *portValue {
	n := cover.count()
	switch {
	case n == 0:
		return denyPorts
	case n > bpf.PolicyMaxPortEntries:
		return v.tooMany(n)
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
	b, text, err := bpf.EncodePortEntries(v.scratch)
	if err != nil { // the count was checked; protocols are never 0
		return &portValue{bytes: denyPorts.bytes, text: denyPorts.text, err: err.Error()}
	}
	pv := &portValue{bytes: b, text: text}
	v.seen[string(v.key)] = pv
	return pv
}

// tooMany is the value of a key whose union has n > 24 entries: it denies
// and says why. One per n.
func (v *valueInterner) tooMany(n int) *portValue {
	key := fmt.Sprintf("too many: %d", n)
	if pv, ok := v.seen[key]; ok {
		return pv
	}
	msg := fmt.Sprintf("%d distinct port entries, a key holds at most %d: the key denies (fails closed)", n, bpf.PolicyMaxPortEntries)
	pv := &portValue{bytes: denyPorts.bytes, text: denyPorts.text, err: msg}
	v.seen[key] = pv
	return pv
}
