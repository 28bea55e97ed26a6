package strictdecode

// The stream level: a file of several documents, split as kubectl splits
// it.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/enimasq/enimasq/cells/errtext"
)

// Document is one document of a YAML stream.
type Document struct {
	// Index numbers the documents as the file's "---" lines do (from 1):
	// documents with nothing between two markers are numbered too.
	Index int
	// Line is the line of the file where the document starts: its "---",
	// or 1 for the first.
	Line int
	// Data is the document's text (line ends as \n).
	Data []byte
}

// Empty says whether the document holds nothing: blank lines, comments,
// document end markers.
func (d Document) Empty() bool {
	for data := d.Data; len(data) > 0; {
		var line []byte
		line, data, _ = bytes.Cut(data, []byte("\n"))
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' && !bytes.HasPrefix(line, []byte("...")) {
			return false
		}
	}
	return true
}

// Documents splits data at its document markers, as kubectl does
// (apimachinery's YAML reader): a line that starts with "---" followed by
// nothing, blanks or a comment. YAML allows "---" at the start of a line
// only as a marker. Documents with nothing between two markers are left
// out; those with blanks or comments only are kept (Empty). A marker
// followed by more is an error naming its line: put the document on the
// next line.
func Documents(data []byte) ([]Document, error) {
	if !bytes.HasPrefix(data, []byte("---")) && !bytes.Contains(data, []byte("\n---")) {
		if len(data) == 0 {
			return nil, nil
		}
		return []Document{{Index: 1, Line: 1, Data: data}}, nil // what the reader would return, uncopied
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var (
		docs    []Document
		rest    = data // the lines not yet read, in step with r
		line    = 1    // rest's first line
		markers = 0    // the markers before rest
		opening = 0    // the line of the last one
		first   = isMarker(data)
	)
	for {
		chunk, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, markerError(rest, line)
		}
		if len(docs) > 0 { // the marker that ended the last document, not in a chunk
			markers, opening = markers+1, line
			rest, line = skipLines(rest, 1), line+1
		}
		n := bytes.Count(chunk, []byte("\n"))
		if isMarker(chunk) { // a marker with nothing before it starts a chunk
			markers, opening = markers+1, line
			chunk = chunk[bytes.IndexByte(chunk, '\n')+1:]
		}
		d := Document{Index: markers + 1, Line: max(opening, 1), Data: chunk}
		if first {
			d.Index-- // a marker on the first line opens the first document
		}
		docs = append(docs, d)
		rest, line = skipLines(rest, n), line+n
	}
}

// isMarker says whether data's first line is a document marker, as
// apimachinery's reader tells.
func isMarker(data []byte) bool { return bytes.HasPrefix(data, []byte("---")) }

// skipLines is data past its first n lines.
func skipLines(data []byte, n int) []byte {
	for ; n > 0 && len(data) > 0; n-- {
		_, data, _ = bytes.Cut(data, []byte("\n"))
	}
	return data
}

// markerError is the error of the first marker in data (at line) that is
// followed by more than a comment.
func markerError(data []byte, line int) error {
	for ; len(data) > 0; line++ {
		var l []byte
		l, data, _ = bytes.Cut(data, []byte("\n"))
		if !isMarker(l) {
			continue
		}
		if rest := bytes.TrimSpace(l[3:]); len(rest) > 0 && rest[0] != '#' {
			return fmt.Errorf("line %d: document marker \"---\" followed by %q: put the document on the next line", line, errtext.Value(rest))
		}
	}
	return errors.New("a document marker \"---\" followed by more than a comment: put the document on the next line")
}
