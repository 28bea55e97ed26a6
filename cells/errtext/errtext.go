// Package errtext formats the values that input errors quote, the same way
// for every input (the ip-masq-agent config, PolicyEndpoints, the CiliumNode,
// API requests, the checkpoint): input is never trusted to be short.
package errtext

import "bytes"

// Value shows a JSON value (or a line of input) in an error, shortened to
// 64 characters.
func Value(raw []byte) string { return Short(string(bytes.TrimSpace(raw))) }

// Short is s shortened to 64 characters for an error message.
func Short(s string) string {
	if len(s) > 64 {
		s = s[:61] + "..."
	}
	return s
}
