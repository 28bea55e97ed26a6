package enimasq_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Who may follow the kernel over netlink. The kernel-state cell
// (cells/kernel) alone subscribes; it and cells/nldump list. Writers list
// what they are about to change, and only that:
var (
	netlinkSubscribers = map[string]string{
		"cells/kernel": "the one subscription of the agent",
	}
	netlinkDumpers = map[string]string{
		"cells/kernel": "the tables' listings",
		"cells/nldump": "the consistent dump every listing goes through",
		// Writers: the ENI rules and routes.
		"ipam/datapath": "writer: an EEXIST checked against the exact rule, the CNI's ingress rule before a delete, " +
			"the prune of its own protocol, an ENI's link by MAC before a route is written, uninstall and script commands",
		// Writers: the policy programs on the pods' devices.
		"policymap/netpolicy/enforce": "writer: the tc qdiscs and filters of a device before attaching, " +
			"foreign programs, uninstall, a device by name for a CNI ADD's wait",
		// Another process: the CNI plugin makes the pod's veth.
		"cmd/enimasq-cni": "writer in its own process: the pod's links it creates",
	}
	// netlinkListCalls are the dumping functions of vishvananda/netlink
	// (and methods of its Handle, or of an interface over it).
	netlinkListCalls = map[string]bool{
		"LinkList": true, "AddrList": true, "RouteList": true, "RouteListFiltered": true, "RouteListFilteredIter": true,
		"RuleList": true, "RuleListFiltered": true, "QdiscList": true, "FilterList": true, "ClassList": true,
		"NeighList": true, "NeighListExecute": true,
	}
)

// TestNetlinkOnlyInTheKernelCell: no non-test Go file subscribes to netlink
// (netlink.*Subscribe*, nl.Subscribe*) outside cells/kernel, and none lists
// (netlink's *List* functions and Handle methods, cells/nldump) outside the
// packages of netlinkDumpers: every other reader derives from the
// kernel-links, kernel-addrs, kernel-routes and kernel-rules tables. Fakes
// (packages for tests) are left out: they implement the calls.
func TestNetlinkOnlyInTheKernelCell(t *testing.T) {
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case !d.IsDir():
			return nil
		case path != "." && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || strings.Contains(d.Name(), "fake")):
			return filepath.SkipDir
		}
		dirs = append(dirs, filepath.ToSlash(path))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	subscribes, dumps := 0, 0
	used := map[string]bool{} // the allowed packages that do list or subscribe
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			name := e.Name()
			if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			file := filepath.Join(dir, name)
			s, d := netlinkCalls(t, file)
			for _, call := range s {
				subscribes++
				used[dir] = true
				if netlinkSubscribers[dir] == "" {
					t.Errorf("%s: %s: only cells/kernel subscribes to netlink; derive from its tables", file, call)
				}
			}
			for _, call := range d {
				dumps++
				used[dir] = true
				if netlinkDumpers[dir] == "" {
					t.Errorf("%s: %s: only cells/kernel, cells/nldump and the writers list over netlink; derive from the kernel tables", file, call)
				}
			}
		}
	}
	if subscribes == 0 || dumps == 0 {
		t.Fatalf("%d subscriptions and %d listings found: the scan finds none", subscribes, dumps)
	}
	// An allowance no package needs any more goes.
	for _, allowed := range []map[string]string{netlinkSubscribers, netlinkDumpers} {
		for dir := range allowed {
			if !used[dir] {
				t.Errorf("%s is allowed to list or subscribe but does not: take it off the list", dir)
			}
		}
	}
}

// netlinkCalls are the subscriptions and the listings that a file calls.
func netlinkCalls(t *testing.T, file string) (subscribes, dumps []string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	pkgs := map[string]string{} // local name -> import path, for the netlink packages
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		switch path {
		case "github.com/vishvananda/netlink", "github.com/vishvananda/netlink/nl", module + "cells/nldump":
			name := filepath.Base(path)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			pkgs[name] = path
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		fn := sel.Sel.Name
		x, isIdent := sel.X.(*ast.Ident)
		pkg := ""
		if isIdent {
			pkg = pkgs[x.Name]
		}
		switch {
		case pkg != "" && strings.Contains(fn, "Subscribe"):
			subscribes = append(subscribes, x.Name+"."+fn)
		case pkg == module+"cells/nldump":
			dumps = append(dumps, x.Name+"."+fn)
		case netlinkListCalls[fn] && (pkg != "" || !isIdent || pkgs[x.Name] == ""):
			// netlink.RuleList, or a method: h.RuleList, o.nl.RuleList.
			dumps = append(dumps, exprString(sel))
		}
		return true
	})
	return subscribes, dumps
}

func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	}
	return "(...)"
}
