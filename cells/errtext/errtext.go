// Package errtext formats the values that input errors quote, the same way
// for every input file (ip-masq-agent config, PolicyEndpoints).
package errtext

import "bytes"

// Value shows a JSON value (or a line of input) in an error, shortened to
// 64 characters.
func Value(raw []byte) string {
	s := string(bytes.TrimSpace(raw))
	if len(s) > 64 {
		s = s[:61] + "..."
	}
	return s
}
