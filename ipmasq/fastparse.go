package ipmasq

import (
	"bytes"
	"net/netip"
	"strconv"
	"strings"
)

// decodeFast reads the common form of the file, a block list of plain CIDRs
// under the exact field names, without a YAML decoder:
//
//	nonMasqueradeCIDRs:
//	- 10.0.0.0/8
//	  ...
//	masqLinkLocal: false
//
// It accepts only a strict subset of YAML whose meaning is not in doubt:
// lines ending in \n; blank lines and whole-line comments at column 0
// (printable ASCII);
// top-level fields spelt exactly as in File, each at most once; a field's
// value either on its line (true/false, a whole number, a duration, `[]`)
// or, for nonMasqueradeCIDRs only, as a block list whose items are all at
// the same indentation and are plain CIDR-like scalars (hex digits, '.',
// ':', one or more '/', ending in a digit). Anything else (quotes, flow
// lists, other spellings, comments after a value, tabs, CR, a duplicate
// field, a value of another type) returns ok=false and the caller uses the
// full decoder, which gives the warnings and errors. FuzzDecodeFast checks
// that the two agree on every input this one accepts.
func decodeFast(data []byte) (f File, ok bool) {
	var (
		seen      [5]bool // by index in fileFields
		inList    bool    // the lines after "nonMasqueradeCIDRs:" with no value
		listed    bool    // items were read for it
		itemInset = -1
		anyField  bool
	)
	// A rough count: the list has about one item per line.
	if n := bytes.Count(data, []byte{'\n'}); n > 4 {
		f.NonMasqueradeCIDRs = make([]string, 0, n)
	}
	// The items are substrings of one copy of the file: one allocation.
	text, off := string(data), 0
	for len(data) > 0 {
		nl := bytes.IndexByte(data, '\n')
		if nl < 0 {
			return File{}, false // the last line must end in \n (no doubt about truncation)
		}
		line, lineOff := data[:nl], off
		data, off = data[nl+1:], off+nl+1
		if len(line) == 0 {
			continue
		}
		if line[0] == '#' {
			for _, c := range line {
				if c < ' ' || c > '~' {
					return File{}, false // YAML wants printable text
				}
			}
			continue
		}
		// An item of the list: spaces, "- ", a CIDR.
		inset := 0
		for inset < len(line) && line[inset] == ' ' {
			inset++
		}
		if inset < len(line) && line[inset] == '-' {
			if !inList || inset+2 > len(line) || line[inset+1] != ' ' {
				return File{}, false
			}
			if itemInset < 0 {
				itemInset = inset
			} else if inset != itemInset {
				return File{}, false
			}
			v := line[inset+2:]
			if !plainCIDR(v) {
				return File{}, false
			}
			f.NonMasqueradeCIDRs = append(f.NonMasqueradeCIDRs, text[lineOff+inset+2:lineOff+len(line)])
			listed = true
			continue
		}
		if inset != 0 {
			return File{}, false
		}
		// A field: "name:" or "name: value".
		colon := bytes.IndexByte(line, ':')
		if colon < 0 {
			return File{}, false
		}
		name, value := line[:colon], line[colon+1:]
		field := -1
		for i, known := range fileFields {
			if string(name) == known {
				field = i
			}
		}
		if field < 0 || seen[field] {
			return File{}, false
		}
		seen[field] = true
		anyField = true
		if inList && !listed {
			// "nonMasqueradeCIDRs:" with no items is null: no list.
			f.NonMasqueradeCIDRs = nil
		}
		inList = false
		if len(value) == 0 {
			if field != 0 {
				return File{}, false
			}
			inList, listed = true, false
			f.NonMasqueradeCIDRs = f.NonMasqueradeCIDRs[:0]
			continue
		}
		if value[0] != ' ' {
			return File{}, false
		}
		value = value[1:]
		if len(value) == 0 {
			return File{}, false
		}
		switch fileFields[field] {
		case "nonMasqueradeCIDRs":
			if string(value) != "[]" {
				return File{}, false
			}
			f.NonMasqueradeCIDRs = []string{}
		case "masqLinkLocal", "masqLinkLocalIPv6":
			var b bool
			switch string(value) {
			case "true":
				b = true
			case "false":
			default:
				return File{}, false
			}
			if field == 1 {
				f.MasqLinkLocal = b
			} else {
				f.MasqLinkLocalIPv6 = b
			}
		case "resyncInterval":
			if !plainDuration(value) {
				return File{}, false
			}
			f.ResyncInterval = string(value)
		case "cidrLimit":
			if len(value) > 9 || (value[0] == '0' && len(value) > 1) {
				return File{}, false
			}
			n, err := strconv.Atoi(string(value))
			if err != nil || n < 0 {
				return File{}, false
			}
			f.CIDRLimit = &n
		}
	}
	if !anyField {
		return File{}, false
	}
	if inList && !listed {
		f.NonMasqueradeCIDRs = nil
	}
	if !seen[0] {
		f.NonMasqueradeCIDRs = nil
	}
	return f, true
}

// plainCIDR: hex digits, '.', ':' and at least one '/', starting with a
// hex digit and ending in a digit: a YAML plain scalar that can only be
// read as a string (never a number, a key or a comment).
func plainCIDR(v []byte) bool {
	if len(v) < 3 || !isHex(v[0]) || v[len(v)-1] < '0' || v[len(v)-1] > '9' {
		return false
	}
	slash := false
	for _, c := range v {
		switch {
		case c == '/':
			slash = true
		case c == '.' || c == ':' || isHex(c):
		default:
			return false
		}
	}
	return slash
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// plainDuration: one or more "digits[.digits]unit" with a unit of
// ns, us, ms, s, m or h: a plain scalar that YAML reads as a string.
func plainDuration(v []byte) bool {
	if len(v) == 0 {
		return false
	}
	for len(v) > 0 {
		i := 0
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			i++
		}
		if i == 0 {
			return false
		}
		if i < len(v) && v[i] == '.' {
			j := i + 1
			for j < len(v) && v[j] >= '0' && v[j] <= '9' {
				j++
			}
			if j == i+1 {
				return false
			}
			i = j
		}
		v = v[i:]
		switch {
		case bytes.HasPrefix(v, []byte("ns")), bytes.HasPrefix(v, []byte("us")), bytes.HasPrefix(v, []byte("ms")):
			v = v[2:]
		case len(v) > 0 && (v[0] == 's' || v[0] == 'm' || v[0] == 'h'):
			v = v[1:]
		default:
			return false
		}
	}
	return true
}

// parsePrefix is netip.ParsePrefix with a fast path for the canonical IPv4
// form "a.b.c.d/n" (no leading zeros, no spaces), which is most of a large
// file; anything else goes to netip.ParsePrefix (FuzzParsePrefix checks
// that the two agree).
func parsePrefix(s string) (netip.Prefix, error) {
	if p, ok := parsePrefix4(s); ok {
		return p, nil
	}
	return netip.ParsePrefix(strings.TrimSpace(s))
}

func parsePrefix4(s string) (netip.Prefix, bool) {
	var a [4]byte
	i := 0
	num := func(max int) (int, bool) {
		start, n := i, 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' && i-start < 3 {
			n = n*10 + int(s[i]-'0')
			i++
		}
		if i == start || n > max || (s[start] == '0' && i-start > 1) {
			return 0, false
		}
		return n, true
	}
	for k := range 4 {
		n, ok := num(255)
		if !ok {
			return netip.Prefix{}, false
		}
		a[k] = byte(n)
		sep := byte('.')
		if k == 3 {
			sep = '/'
		}
		if i >= len(s) || s[i] != sep {
			return netip.Prefix{}, false
		}
		i++
	}
	bits, ok := num(32)
	if !ok || i != len(s) {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(netip.AddrFrom4(a), bits), true
}
