package strictdecode

// The rule set of the fast readers, one lexer for both: which lines they
// take and how they read a scalar (see the package comment).

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
)

// blockLine is a line with its indentation and the text after it.
type blockLine struct {
	indent int
	text   string
}

// lexer yields the significant lines of data one by one: blank lines and
// whole-line comments are dropped, trailing blanks cut. It stops, bad, at
// a line outside the rule set: bytes other than printable ASCII and \n,
// document markers and directives, the indicators of anchors, tags, block
// scalars, flow collections (an empty [] or {} as a whole value is in),
// single quotes, escapes, and comments after text.
type lexer struct {
	text  string // what is left; the lines are substrings of it
	bad   bool
	plain bool // no indicator but '#' in the text: no line needs a look for them
	hash  bool // a '#' in the text
}

// newLexer checks data's bytes once, for all its lines.
func newLexer(data []byte) *lexer {
	var seen uint8
	for _, c := range data {
		seen |= byteClass[c]
	}
	return &lexer{text: string(data), bad: seen&badByte != 0, plain: seen&indicatorByte == 0, hash: seen&hashByte != 0}
}

// next is the next significant line; false at the end or when bad.
func (l *lexer) next() (blockLine, bool) {
	for len(l.text) > 0 && !l.bad {
		line := l.text
		if nl := strings.IndexByte(line, '\n'); nl >= 0 {
			line, l.text = line[:nl], line[nl+1:]
		} else {
			l.text = ""
		}
		for line != "" && line[len(line)-1] == ' ' {
			line = line[:len(line)-1]
		}
		indent := 0
		for indent < len(line) && line[indent] == ' ' {
			indent++
		}
		text := line[indent:]
		switch {
		case text == "" || text[0] == '#':
			continue // blank, or a comment
		case l.hash && strings.IndexByte(text, '#') > 0, // a comment after text, or a '#' in it
			(text[0] == '-' || text[0] == '.') && (strings.HasPrefix(text, "---") || strings.HasPrefix(text, "...")),
			!l.plain && strings.ContainsAny(text, indicators) && !onlyEmptyCollection(text):
			l.bad = true
			return blockLine{}, false
		}
		return blockLine{indent: indent, text: text}, true
	}
	return blockLine{}, false
}

// onlyEmptyCollection says whether the only indicators of text are an
// empty [] or {} that is its whole value.
func onlyEmptyCollection(text string) bool {
	body, ok := strings.CutSuffix(text, " []")
	if !ok {
		body, ok = strings.CutSuffix(text, " {}")
	}
	return ok && !strings.ContainsAny(body, indicators)
}

// indicators are the characters outside the rule set but in a whole-line
// comment.
const indicators = "#&*!|>'{}[]%@`\\"

// The classes of bytes: good, not in the rule set (tabs, CRs, control and
// non-ASCII bytes), an indicator, '#' (looked for line by line).
const (
	goodByte      = 0
	badByte       = 1
	indicatorByte = 2
	hashByte      = 4
)

var byteClass = func() (c [256]uint8) {
	for i := range c {
		if (i < ' ' || i > '~') && i != '\n' {
			c[i] = badByte
		}
	}
	for _, i := range indicators {
		c[i] = indicatorByte
	}
	c['#'] = hashByte
	return c
}()

// blockLines is all the significant lines of data; ok is false when one is
// outside the rule set.
func blockLines(data []byte) ([]blockLine, bool) {
	lines := make([]blockLine, 0, bytes.Count(data, []byte{'\n'})+1)
	l := newLexer(data)
	for line, ok := l.next(); ok; line, ok = l.next() {
		lines = append(lines, line)
	}
	return lines, !l.bad
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
	if !isWord(key) && !isAddress(key) && !isInt(key) {
		return "", "", false
	}
	return key, value, true
}

// isItem says whether a line's text is an item of a block sequence.
func isItem(text string) bool { return text == "-" || strings.HasPrefix(text, "- ") }

// scalarKind is what a scalar of the rule set reads as.
type scalarKind int

const (
	notScalar   scalarKind = iota // outside the rule set: the reader declines
	stringValue                   // a plain string, as written
	quotedValue                   // a double-quoted string: the text inside
	intValue                      // a whole number, as written
	boolValue                     // true or false
	emptyList                     // []
	emptyMap                      // {}
)

// scalar says what s, a value on its line, reads as.
func scalar(s string) scalarKind {
	switch {
	case isCIDR(s): // first: the items of a large ip-masq-agent file
		return stringValue
	case isInt(s):
		return intValue
	case s == "true" || s == "false":
		return boolValue
	case s == "[]":
		return emptyList
	case s == "{}":
		return emptyMap
	case len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' && !strings.Contains(s[1:len(s)-1], `"`):
		return quotedValue
	case isWord(s), isAddress(s), isDuration(s):
		return stringValue
	}
	return notScalar
}

// appendScalar appends the JSON of a scalar of kind k.
func appendScalar(out []byte, s string, k scalarKind) []byte {
	switch k {
	case quotedValue:
		return strconv.AppendQuote(out, s[1:len(s)-1])
	case stringValue:
		return strconv.AppendQuote(out, s)
	}
	return append(out, s...) // a number, true, false, [], {}
}

// yamlWords are the plain words YAML reads as something else than a
// string (compared in lower case).
var yamlWords = map[string]bool{"true": true, "false": true, "yes": true, "no": true, "on": true, "off": true,
	"y": true, "n": true, "null": true, "nan": true, "inf": true}

// isWord: a letter, then letters, digits and _ . / -; not a word YAML
// reads as a boolean, a null or a number.
func isWord(s string) bool {
	if s == "" || !isLetter(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isLetter(c) && !isDigit(c) && c != '_' && c != '.' && c != '/' && c != '-' {
			return false
		}
	}
	return len(s) > 5 || !yamlWords[strings.ToLower(s)]
}

// isInt: 0, or up to 15 digits without a leading zero (YAML reads a
// leading zero as octal).
func isInt(s string) bool {
	if s == "" || len(s) > 15 || (s[0] == '0' && len(s) > 1) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// isCIDR: hex digits, '.', ':' and at least one '/', a hex digit first and
// a digit last: a plain scalar that can only be read as a string (never a
// number, a key or a comment).
func isCIDR(s string) bool {
	if len(s) < 3 || !isHex(s[0]) || !isDigit(s[len(s)-1]) {
		return false
	}
	slash := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '/':
			slash = true
		case c == '.' || c == ':' || isHex(c):
		default:
			return false
		}
	}
	return slash
}

// plainAddress is an address, or a CIDR, with dots or colons enough that
// no YAML resolver reads it as a number or a time.
var plainAddress = regexp.MustCompile(`^[0-9]+(\.[0-9]+){2,}(/[0-9]+)?$|^[0-9a-fA-F]*:[0-9a-fA-F]*:[0-9a-fA-F:.]*(/[0-9]+)?$`)

// isAddress says whether s is a plain address or CIDR: YAML reads a colon
// first or last as an indicator, not as text.
func isAddress(s string) bool {
	return plainAddress.MatchString(s) && !strings.HasPrefix(s, ":") && !strings.HasSuffix(s, ":")
}

// isDuration: one or more "digits[.digits]unit" with a unit of ns, us,
// ms, s, m or h (a Go duration such as 1m30s), which YAML reads as a
// string.
func isDuration(s string) bool {
	if s == "" {
		return false
	}
	for len(s) > 0 {
		i := 0
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == 0 {
			return false
		}
		if i < len(s) && s[i] == '.' {
			j := i + 1
			for j < len(s) && isDigit(s[j]) {
				j++
			}
			if j == i+1 {
				return false
			}
			i = j
		}
		s = s[i:]
		switch {
		case strings.HasPrefix(s, "ns"), strings.HasPrefix(s, "us"), strings.HasPrefix(s, "ms"):
			s = s[2:]
		case s != "" && (s[0] == 's' || s[0] == 'm' || s[0] == 'h'):
			s = s[1:]
		default:
			return false
		}
	}
	return true
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool  { return c >= '0' && c <= '9' }
func isHex(c byte) bool    { return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }
