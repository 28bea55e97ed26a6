package strictdecode

import (
	"strconv"
	"strings"
)

// blockToJSON is the block reader: the JSON of data when data is a block
// mapping in the rule set (the style kubectl prints: mappings and
// sequences by indentation, each key once), as sigs.k8s.io/yaml reads it;
// ok is false for anything else, which the YAML library then reads. A
// large PolicyEndpoint decodes several times faster this way.
// FuzzBlockToJSON holds it to the library.
func blockToJSON(data []byte) (js []byte, ok bool) {
	lines, ok := blockLines(data)
	if !ok || len(lines) == 0 || lines[0].indent != 0 {
		return nil, false
	}
	b := &blockParser{lines: lines, out: make([]byte, 0, len(data)+len(data)/4)}
	if !b.mapping(0) || b.i != len(b.lines) {
		return nil, false
	}
	return b.out, true
}

type blockParser struct {
	lines []blockLine
	i     int
	out   []byte
}

// mapping reads the block mapping whose keys are at indent.
func (b *blockParser) mapping(indent int) bool {
	b.out = append(b.out, '{')
	seen := map[string]bool{}
	for first := true; b.i < len(b.lines) && b.lines[b.i].indent == indent && !strings.HasPrefix(b.lines[b.i].text, "- ") && b.lines[b.i].text != "-"; first = false {
		key, value, ok := splitKey(b.lines[b.i].text)
		if !ok || seen[key] {
			return false
		}
		seen[key] = true
		if !first {
			b.out = append(b.out, ',')
		}
		b.out = strconv.AppendQuote(b.out, key)
		b.out = append(b.out, ':')
		b.i++
		if !b.value(value, indent) {
			return false
		}
	}
	b.out = append(b.out, '}')
	return true
}

// value reads the value of a key at indent: inline, or the block below it.
func (b *blockParser) value(inline string, indent int) bool {
	if inline != "" {
		return b.scalar(inline)
	}
	if b.i >= len(b.lines) {
		b.out = append(b.out, "null"...)
		return true
	}
	next := b.lines[b.i]
	switch {
	case isItem(next.text) && next.indent >= indent:
		// A sequence under a key may be at the key's indentation.
		return b.sequence(next.indent)
	case next.indent > indent:
		return b.mapping(next.indent)
	}
	b.out = append(b.out, "null"...)
	return true
}

// sequence reads the block sequence whose dashes are at indent.
func (b *blockParser) sequence(indent int) bool {
	b.out = append(b.out, '[')
	for first := true; b.i < len(b.lines) && b.lines[b.i].indent == indent && isItem(b.lines[b.i].text); first = false {
		if !first {
			b.out = append(b.out, ',')
		}
		item := strings.TrimLeft(strings.TrimPrefix(b.lines[b.i].text, "-"), " ")
		itemIndent := indent + len(b.lines[b.i].text) - len(item)
		switch {
		case item == "":
			return false // a nested block item: not kubectl's style
		case isItem(item):
			return false
		}
		if _, _, isKey := splitKey(item); isKey {
			// "- key: value": a mapping whose keys line up after the dash.
			b.lines[b.i] = blockLine{indent: itemIndent, text: item}
			if !b.mapping(itemIndent) {
				return false
			}
			continue
		}
		b.i++
		if !b.scalar(item) {
			return false
		}
	}
	b.out = append(b.out, ']')
	return true
}

// scalar appends the JSON of a scalar of the rule set.
func (b *blockParser) scalar(s string) bool {
	k := scalar(s)
	if k == notScalar {
		return false
	}
	b.out = appendScalar(b.out, s, k)
	return true
}
