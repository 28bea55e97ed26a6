package enimasq_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/enimasq/enimasq/"

// features are the feature packages, by directory; rowTypes are what one
// may use of another: the row type of a table it reads.
var (
	features = []string{"ipmasq", "ipam", "policymap/masqmap", "policymap/netpolicy"}
	// ipamParts are the parts of ipam, which meet through the tables
	// of the table packages (enis, ipam-allocations): a part imports
	// none of the others.
	ipamParts     = []string{"ipam/allocator", "ipam/podset", "ipam/datapath"}
	ipamTablePkgs = []string{"ipam/ciliumnode", "ipam/allocations"}
	// netpolicyTablePkgs are the table packages of network policy
	// (policy-endpoints); every other package under policymap/netpolicy
	// is a part (source, compile, enforce) or a library (inspect), and
	// imports of policymap/netpolicy only these.
	netpolicyTablePkgs = []string{"policymap/netpolicy/endpoints"}
	rowTypes           = map[string]map[string]bool{
		"ipmasq": {"CIDR": true}, // the ip-masq-agent-cidrs row
	}
)

// TestFeaturesMeetThroughTables: a feature package and its parts (their
// non-test files) import another feature only for the row type of a table
// they read, so features meet through tables; network policy does not
// import ipam (the node's addresses come from node-ips).
func TestFeaturesMeetThroughTables(t *testing.T) {
	for _, dir := range featureDirs(t) {
		for _, file := range goFiles(t, filepath.Join(".", dir)) {
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			names := map[string]string{} // local name -> feature directory
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				other, ok := strings.CutPrefix(path, module)
				if !ok || featureOf(other) == "" || featureOf(other) == featureOf(dir) {
					continue
				}
				if rowTypes[other] == nil {
					t.Errorf("%s imports feature %s: features meet through tables", file, other)
					continue
				}
				name := filepath.Base(other)
				if imp.Name != nil {
					name = imp.Name.Name
				}
				names[name] = other
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); ok && names[x.Name] != "" && !rowTypes[names[x.Name]][sel.Sel.Name] {
					t.Errorf("%s uses %s.%s: of feature %s only the row type of a table may be used", file, x.Name, sel.Sel.Name, names[x.Name])
				}
				return true
			})
		}
	}
}

// featureOf is the feature a package directory belongs to: the feature
// itself or one of its parts ("" for none).
func featureOf(dir string) string {
	for _, f := range features {
		if dir == f || strings.HasPrefix(dir, f+"/") {
			return f
		}
	}
	return ""
}

// featureDirs are the feature packages and the packages under them (their
// parts), but for packages for tests (fakes and test helpers).
func featureDirs(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, f := range features {
		err := filepath.WalkDir(f, func(path string, d os.DirEntry, err error) error {
			switch {
			case err != nil:
				return err
			case !d.IsDir():
				return nil
			case d.Name() == "testdata":
				return filepath.SkipDir
			}
			if path == f || !strings.Contains(d.Name(), "fake") && !strings.HasSuffix(d.Name(), "test") {
				out = append(out, filepath.ToSlash(path))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func goFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if name := e.Name(); strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			out = append(out, filepath.Join(dir, name))
		}
	}
	if len(out) == 0 {
		t.Fatalf("no Go files in %s", dir)
	}
	return out
}

// TestNoFakeInTheAgent: no fake (a package for tests, such as
// ipam/netlinkfake) and no Cilium package is linked into the standalone
// binaries, and no feature package imports Cilium.
func TestNoFakeInTheAgent(t *testing.T) {
	out := goListDeps(t, "-f", "{{.ImportPath}} {{join .GoFiles \" \"}}",
		"./cmd/enimasq-agent", "./cmd/enimasq-cni", "./cmd/enimasq-dbg")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 50 {
		t.Fatalf("go list -deps listed %d packages: not the binaries' dependencies", len(lines))
	}
	for _, line := range lines {
		pkg, files, _ := strings.Cut(line, " ")
		switch {
		case strings.HasPrefix(pkg, "github.com/cilium/cilium/"):
			t.Errorf("%s is linked into the binaries: only cmd/cilium-agent imports Cilium", pkg)
		case !strings.HasPrefix(pkg, module):
		case strings.Contains(pkg, "fake") || strings.HasSuffix(pkg, "test") || strings.Contains(pkg, "/test/"):
			t.Errorf("%s is linked into the binaries: fakes and test helpers are for tests", pkg)
		default:
			for _, f := range strings.Fields(files) {
				if strings.HasPrefix(f, "fake") {
					t.Errorf("%s/%s is linked into the binaries: a fake belongs in a package for tests", pkg, f)
				}
			}
		}
	}
}

// TestIPAMPartsMeetThroughTables: of ipam's parts, the allocator, the pod
// set and the datapath import none of each other (the datapath never the
// allocator: it reads ipam-allocations, whoever writes it), and the table
// packages import no part. Only the composing cell (ipam) imports them all.
func TestIPAMPartsMeetThroughTables(t *testing.T) {
	forbidden := map[string]bool{}
	for _, p := range ipamParts {
		forbidden[module+p] = true
	}
	for _, dir := range append(slices.Clone(ipamParts), ipamTablePkgs...) {
		for _, file := range goFiles(t, filepath.Join(".", dir)) {
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if forbidden[path] && path != module+dir {
					t.Errorf("%s imports %s: ipam's parts meet through tables", file, path)
				}
			}
		}
	}
}

// TestNetworkPolicyPartsMeetThroughTables: no package under
// policymap/netpolicy (its non-test files) imports policymap/netpolicy or
// another package under it but a table package (endpoints, the row type of
// policy-endpoints), and a table package imports none of them: the source,
// the compiler and enforcement meet through tables, and only the composing
// cell (policymap/netpolicy) imports them all. Every directory under it is
// checked, so a new part is held to it too.
func TestNetworkPolicyPartsMeetThroughTables(t *testing.T) {
	const root = "policymap/netpolicy"
	tables := map[string]bool{}
	for _, p := range netpolicyTablePkgs {
		tables[module+p] = true
	}
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case !d.IsDir() || path == root:
			return nil
		case d.Name() == "testdata":
			return filepath.SkipDir
		}
		dirs = append(dirs, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 4 {
		t.Fatalf("%d packages under %s: %v", len(dirs), root, dirs)
	}
	for _, dir := range dirs {
		self := module + filepath.ToSlash(dir)
		for _, file := range goFiles(t, dir) {
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if path == self || path != module+root && !strings.HasPrefix(path, module+root+"/") {
					continue
				}
				if !tables[path] || tables[self] {
					t.Errorf("%s imports %s: network policy's parts meet through tables (only %v may be imported)", file, path, netpolicyTablePkgs)
				}
			}
		}
	}
}

// TestNoFeatureImportsCilium: no package of the main module but the
// composition's tests depends on Cilium: only cmd/cilium-agent (a module
// of its own) imports it.
func TestNoFeatureImportsCilium(t *testing.T) {
	n := 0
	for _, pkg := range strings.Fields(goListDeps(t, "./ipmasq/...", "./ipam/...", "./policymap/...", "./bpf/...", "./cells/...")) {
		n++
		if strings.HasPrefix(pkg, "github.com/cilium/cilium/") {
			t.Errorf("%s is a dependency of the feature packages: only cmd/cilium-agent imports Cilium", pkg)
		}
	}
	if n < 50 {
		t.Fatalf("go list -deps listed %d packages", n)
	}
}

// goListDeps is the output of go list -deps with args; it skips the test
// as a user who cannot use the Go caches (make test-unprivileged: they are
// the builder's).
func goListDeps(t *testing.T, args ...string) string {
	t.Helper()
	goTool := os.Getenv("GO")
	if goTool == "" {
		goTool = "go"
	}
	cmd := exec.Command(goTool, append([]string{"list", "-deps"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil && strings.Contains(stderr.String(), "permission denied") {
		t.Skipf("go list cannot use the Go caches as this user: %s", strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, stderr.String())
	}
	return string(out)
}

// apiPackage is the one package that writes and reads the agent API's
// HTTP bodies.
const apiPackage = "cells/agentapi"

// TestOnlyTheAPIPackageWritesHTTPBodies: no non-test file outside
// cells/agentapi writes an HTTP answer (its headers, its status, its body:
// http.ResponseWriter's methods, json.NewEncoder, fmt.Fprint, io.Copy on
// one, http.Error, a ResponseController) or reads a request's body, so that
// every endpoint answers the same error body and decodes its request
// strictly. A handler hands its ResponseWriter and Request to agentapi's
// helpers (or to another handler) only.
func TestOnlyTheAPIPackageWritesHTTPBodies(t *testing.T) {
	files := 0
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (d.Name() == "testdata" || path != "." && strings.HasPrefix(d.Name(), ".")):
			return filepath.SkipDir
		case d.IsDir() && filepath.ToSlash(path) == apiPackage:
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		files++
		for _, fault := range httpBodyFaults(t, path) {
			t.Errorf("%s: only %s writes HTTP answers and reads request bodies", fault, apiPackage)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("%d non-test Go files: not the module", files)
	}
}

// httpBodyFaults lists where file writes an answer or reads a request body
// itself: a use of a parameter of type http.ResponseWriter or *http.Request
// other than handing it on, and http.Error and http.NewResponseController.
func httpBodyFaults(t *testing.T, file string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	httpName := ""
	for _, imp := range f.Imports {
		if path, _ := strconv.Unquote(imp.Path.Value); path == "net/http" {
			httpName = "http"
			if imp.Name != nil {
				httpName = imp.Name.Name
			}
		}
	}
	if httpName == "" {
		return nil
	}
	isHTTP := func(e ast.Expr, name string) bool {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		x, ok := sel.X.(*ast.Ident)
		return ok && x.Name == httpName && sel.Sel.Name == name
	}
	// The names of the handlers' parameters: writers and requests.
	writers, requests := map[string]bool{}, map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		ft, ok := n.(*ast.FuncType)
		if !ok || ft.Params == nil {
			return true
		}
		for _, p := range ft.Params.List {
			star, isPtr := p.Type.(*ast.StarExpr)
			for _, name := range p.Names {
				switch {
				case isHTTP(p.Type, "ResponseWriter"):
					writers[name.Name] = true
				case isPtr && isHTTP(star.X, "Request"):
					requests[name.Name] = true
				}
			}
		}
		return true
	})
	var faults []string
	fault := func(n ast.Node, what string) {
		faults = append(faults, fset.Position(n.Pos()).String()+": "+what)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			x, ok := n.X.(*ast.Ident)
			switch {
			case isHTTP(n, "Error") || isHTTP(n, "NewResponseController"):
				fault(n, httpName+"."+n.Sel.Name)
			case ok && writers[x.Name]:
				fault(n, x.Name+"."+n.Sel.Name+" on an http.ResponseWriter")
			case ok && requests[x.Name] && n.Sel.Name == "Body":
				fault(n, x.Name+".Body of an *http.Request")
			}
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok || !(pkg.Name == "json" || pkg.Name == "fmt" || pkg.Name == "io") {
				return true
			}
			for _, arg := range n.Args {
				if id, ok := arg.(*ast.Ident); ok && writers[id.Name] {
					fault(n, pkg.Name+"."+sel.Sel.Name+" on an http.ResponseWriter")
				}
			}
		}
		return true
	})
	return faults
}
