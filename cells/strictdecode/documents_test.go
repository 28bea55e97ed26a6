package strictdecode

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

func TestDocuments(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"", "", ""},
		{"a: 1\n", `1@1 "a: 1\n"`, ""},
		{"a: 1", `1@1 "a: 1"`, ""},
		{"---\na: 1\n", `1@1 "a: 1\n"`, ""},
		{"# c\n---\na: 1\n--- # d\nb: 2\n---\n", `1@1 "# c\n" 2@2 "a: 1\n" 3@4 "b: 2\n"`, ""},
		{"a\n---\n---\nb\n", `1@1 "a\n" 3@3 "b\n"`, ""},
		{"---\n---\n", `1@1 ""`, ""},
		{"a: 1\r\n---\r\nb: 2\r\n", `1@1 "a: 1\n" 2@2 "b: 2\n"`, ""},
		{"a\n---\nb\n--- {a: 1}\n", "", `line 4: document marker "---" followed by "{a: 1}"`},
	} {
		docs, err := Documents([]byte(tc.in))
		var got []string
		for _, d := range docs {
			got = append(got, fmt.Sprintf("%d@%d %q", d.Index, d.Line, d.Data))
		}
		switch {
		case tc.err == "" && (err != nil || strings.Join(got, " ") != tc.want):
			t.Errorf("%q: %s, %v; want %s", tc.in, strings.Join(got, " "), err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v; want an error with %q", tc.in, err, tc.err)
		}
	}
}

// FuzzDocuments: each document's line and text are where the file has
// them (the numbering kept in step with apimachinery's reader).
func FuzzDocuments(f *testing.F) {
	for _, s := range []string{"a\n---\n---\nb\n", "---\na: 1\n--- # x\n", "a\r\n---\r\nb", "--- a\n", "----\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, err := Documents(data)
		if err != nil {
			return
		}
		lines := strings.SplitAfter(string(data), "\n")
		last := 0
		for _, d := range docs {
			if d.Index <= last || d.Line < 1 || d.Line > len(lines) {
				t.Fatalf("%q: document %d at line %d after %d", data, d.Index, d.Line, last)
			}
			last = d.Index
			start := d.Line - 1
			if strings.HasPrefix(lines[start], "---") {
				start++
			} else if d.Line != 1 {
				t.Fatalf("%q: document %d starts at line %d, not a marker", data, d.Index, d.Line)
			}
			var want []byte
			for _, l := range lines[start:min(start+bytes.Count(d.Data, []byte("\n")), len(lines))] {
				if crlf, ok := strings.CutSuffix(l, "\r\n"); ok {
					l = crlf // bufio's ReadLine drops a CR only before a LF
				} else {
					l = strings.TrimSuffix(l, "\n")
				}
				want = append(append(want, l...), '\n')
			}
			if got := bytes.TrimSuffix(d.Data, []byte("\n")); !bytes.Equal(got, bytes.TrimSuffix(want, []byte("\n"))) && !bytes.Equal(d.Data, data) {
				t.Fatalf("%q: document %d at line %d is %q, the file has %q there", data, d.Index, d.Line, d.Data, want)
			}
		}
	})
}
