package enimasq_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// bpfPrograms are the packages of a BPF program and its maps' ABI; package
// bpf is the generic map operations they share.
var bpfPrograms = []string{"bpf/policybpf", "bpf/masqbpf"}

// TestBPFByConcern: bpf/ is split by concern. Package bpf (the generic map
// operations) imports no program's package, a program's package imports no
// other program's, and each says in its doc.go what it holds.
func TestBPFByConcern(t *testing.T) {
	for _, dir := range append([]string{"bpf"}, bpfPrograms...) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		doc := false
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") {
				continue
			}
			file := filepath.Join(dir, e.Name())
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if e.Name() == "doc.go" && f.Doc != nil {
				doc = true
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				for _, p := range bpfPrograms {
					if path == module+p && p != dir {
						t.Errorf("%s imports %s: package bpf knows no program, and a program's package no other program", file, path)
					}
				}
			}
		}
		if !doc {
			t.Errorf("%s has no doc.go with a package doc saying what it holds", dir)
		}
	}
}
