package source

import (
	"bytes"
	"fmt"
	"regexp"

	"github.com/enimasq/enimasq/cells/errtext"
)

// docMarker is a YAML document marker line and what follows it.
var docMarker = regexp.MustCompile(`(?m)^---(.*)$`)

// splitDocuments splits a YAML stream at its document markers the way
// kubectl does: a line that starts with "---" followed by nothing, blanks or
// a comment. YAML does not allow "---" at the start of a line inside a
// document, so this is exact. Documents with nothing but blanks and
// comments are kept (as empty documents) so that numbering follows the file.
func splitDocuments(data []byte) ([][]byte, error) {
	var docs [][]byte
	start := 0
	for _, m := range docMarker.FindAllSubmatchIndex(data, -1) {
		if rest := bytes.TrimSpace(data[m[2]:m[3]]); len(rest) > 0 && rest[0] != '#' {
			return nil, fmt.Errorf("line %d: document marker \"---\" followed by %q: put the document on the next line",
				bytes.Count(data[:m[0]], []byte("\n"))+1, errtext.Value(rest))
		}
		if m[0] > 0 {
			docs = append(docs, data[start:m[0]])
		}
		start = min(m[1]+1, len(data))
	}
	return append(docs, data[start:]), nil
}
