package strictdecode

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
)

// blockToJSON is the JSON of data when data is YAML in the plain block
// style that kubectl prints (mappings and sequences by indentation, plain
// or double-quoted scalars without escapes, no comments, anchors, tags or
// flow collections, each key once), read as sigs.k8s.io/yaml reads it; ok
// is false for anything else, which the YAML library then reads. A large
// PolicyEndpoint decodes several times faster this way. FuzzBlockToJSON
// holds it to the library.
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

// blockLine is a line with its indentation and the text after it.
type blockLine struct {
	indent int
	text   string
}

// blockLines splits data into its non-blank lines; ok is false for bytes
// or constructs the block reader does not take.
func blockLines(data []byte) ([]blockLine, bool) {
	var lines []blockLine
	for len(data) > 0 {
		line, rest, _ := bytes.Cut(data, []byte("\n"))
		data = rest
		for _, c := range line {
			if c < ' ' || c > '~' {
				return nil, false // tabs, CRs, control or non-ASCII bytes
			}
		}
		text := strings.TrimRight(string(line), " ")
		trimmed := strings.TrimLeft(text, " ")
		if trimmed == "" {
			continue
		}
		if strings.ContainsAny(trimmed, "#&*!|>'{}[]%@`\\") || strings.HasPrefix(trimmed, "---") || strings.HasPrefix(trimmed, "...") {
			return nil, false
		}
		lines = append(lines, blockLine{indent: len(text) - len(trimmed), text: trimmed})
	}
	return lines, true
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

func isItem(text string) bool { return text == "-" || strings.HasPrefix(text, "- ") }

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

// splitKey splits "key: value" or "key:"; the key is a plain scalar.
func splitKey(text string) (key, value string, ok bool) {
	if k, ok := strings.CutSuffix(text, ":"); ok && !strings.Contains(k, ": ") {
		key, value = k, ""
	} else if k, v, ok := strings.Cut(text, ": "); ok {
		key, value = k, strings.TrimLeft(v, " ")
	} else {
		return "", "", false
	}
	if len(key) > 1000 {
		return "", "", false // YAML's implicit keys are at most 1024 characters
	}
	if !(plainWord.MatchString(key) && !yamlWords[strings.ToLower(key)]) && !isAddress(key) && !plainInt.MatchString(key) {
		return "", "", false
	}
	return key, value, true
}

var (
	// Plain scalars read as strings: a letter first, or a CIDR or an
	// address (a digit first, several dots, or a slash or a colon),
	// which no YAML resolver reads as a number.
	plainWord    = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_./-]*$`)
	plainAddress = regexp.MustCompile(`^[0-9]+(\.[0-9]+){2,}(/[0-9]+)?$|^[0-9a-fA-F]*:[0-9a-fA-F]*:[0-9a-fA-F:.]*(/[0-9]+)?$`)
	plainInt     = regexp.MustCompile(`^(0|[1-9][0-9]{0,14})$`)
	yamlWords    = map[string]bool{"true": true, "false": true, "yes": true, "no": true, "on": true, "off": true,
		"y": true, "n": true, "null": true, "nan": true, "inf": true}
)

// scalar appends the JSON of a plain or double-quoted scalar.
func (b *blockParser) scalar(s string) bool {
	switch {
	case strings.HasPrefix(s, `"`):
		if len(s) < 2 || !strings.HasSuffix(s, `"`) || strings.Contains(s[1:len(s)-1], `"`) {
			return false
		}
		b.out = strconv.AppendQuote(b.out, s[1:len(s)-1])
	case plainInt.MatchString(s):
		b.out = append(b.out, s...)
	case plainWord.MatchString(s) && !yamlWords[strings.ToLower(s)]:
		b.out = strconv.AppendQuote(b.out, s)
	case isAddress(s):
		b.out = strconv.AppendQuote(b.out, s)
	default:
		return false
	}
	return true
}

// isAddress says whether s is a plain CIDR or address scalar: YAML reads a
// colon first or last as an indicator, not as text.
func isAddress(s string) bool {
	return plainAddress.MatchString(s) && !strings.HasPrefix(s, ":") && !strings.HasSuffix(s, ":")
}
