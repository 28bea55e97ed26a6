package awspeer

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
)

// The AWS agent's module, the version whose programs are built, and its
// go.sum hash (sum.golang.org's): the zip is checked against it before a file
// is read out of it.
const (
	ModulePath    = "github.com/aws/aws-network-policy-agent"
	ModuleVersion = "v1.5.0"
	ModuleSum     = "h1:t2yGzQq1zRhmG6BmrfWXRwlByb9MjmKkRkEcYNWkuLU="
)

// The sources built, as named in the module zip.
const (
	srcDir    = "pkg/ebpf/c/"
	egressSrc = "tc.v4egress.bpf.c"
	eventsSrc = "v4events.bpf.c"
)

// ErrMissingTools is wrapped by the errors of a machine that cannot build the
// programs: no clang, no bpftool, no libbpf headers or no kernel BTF.
var ErrMissingTools = errors.New("the AWS agent's programs cannot be built here (apt-get install clang libbpf-dev bpftool; the kernel needs /sys/kernel/btf/vmlinux)")

// Objects are the compiled ELF objects, built once a process.
type objects struct {
	egress, events []byte
}

var (
	buildOnce sync.Once
	built     objects
	buildErr  error
)

func build() (objects, error) {
	buildOnce.Do(func() { built, buildErr = compile() })
	return built, buildErr
}

// compile extracts the C sources from the module zip into a temporary
// directory, generates vmlinux.h there and compiles the egress program and the
// events object (which defines the maps the agent shares between programs)
// with the agent's own clang flags. The directory is removed afterwards.
func compile() (objects, error) {
	clang, err := exec.LookPath("clang")
	if err != nil {
		return objects{}, fmt.Errorf("clang not found: %w", ErrMissingTools)
	}
	bpftool, err := lookPath("bpftool", "/usr/sbin/bpftool", "/sbin/bpftool")
	if err != nil {
		return objects{}, fmt.Errorf("bpftool not found: %w", ErrMissingTools)
	}
	const kernelBTF = "/sys/kernel/btf/vmlinux"
	if _, err := os.Stat(kernelBTF); err != nil {
		return objects{}, fmt.Errorf("%s: %w", kernelBTF, ErrMissingTools)
	}
	zipPath, err := moduleZip()
	if err != nil {
		return objects{}, err
	}
	dir, err := os.MkdirTemp("", "awspeer-")
	if err != nil {
		return objects{}, err
	}
	defer os.RemoveAll(dir)
	if err := extract(zipPath, dir); err != nil {
		return objects{}, err
	}

	vmlinux, err := run(bpftool, "btf", "dump", "file", kernelBTF, "format", "c")
	if err != nil {
		return objects{}, fmt.Errorf("generate vmlinux.h: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vmlinux.h"), vmlinux, 0o644); err != nil {
		return objects{}, err
	}

	// The flags of the agent's Makefile (build-bpf): the tc programs get
	// -D__TARGET_ARCH_$(ARCH) with ARCH uname -m as Go names it, the events
	// object -D__TARGET_ARCH_x86.
	cc := func(src, arch string) ([]byte, error) {
		out := filepath.Join(dir, strings.TrimSuffix(src, ".c")+".o")
		if _, err := run(clang, "-g", "-O2", "-Wall", "-fpie", "-target", "bpf", "-DCORE", "-D__BPF_TRACING__",
			"-march=bpf", "-D__TARGET_ARCH_"+arch, "-I", dir, "-c", filepath.Join(dir, src), "-o", out); err != nil {
			if strings.Contains(err.Error(), "bpf/bpf_helpers.h' file not found") {
				return nil, fmt.Errorf("compile %s: libbpf headers not found: %w", src, ErrMissingTools)
			}
			return nil, fmt.Errorf("compile %s: %w", src, err)
		}
		return os.ReadFile(out)
	}
	var objs objects
	if objs.egress, err = cc(egressSrc, runtime.GOARCH); err != nil {
		return objects{}, err
	}
	if objs.events, err = cc(eventsSrc, "x86"); err != nil {
		return objects{}, err
	}
	return objs, nil
}

func lookPath(name string, fallbacks ...string) (string, error) {
	p, err := exec.LookPath(name)
	if err == nil {
		return p, nil
	}
	for _, f := range fallbacks {
		if st, serr := os.Stat(f); serr == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return f, nil
		}
	}
	return "", err
}

func run(name string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// moduleZip is the path of the module's zip in the module cache, downloaded
// with `go mod download` when it is not there yet.
func moduleZip() (string, error) {
	rel := filepath.Join("cache", "download", filepath.FromSlash(ModulePath), "@v", ModuleVersion+".zip")
	if cache := modCache(); cache != "" {
		if p := filepath.Join(cache, rel); fileExists(p) {
			return p, nil
		}
	}
	// Run outside any module so that no go.mod or go.sum is touched, with
	// the local toolchain: the module's go.mod asks for a newer Go than may
	// be running here, which the go command reports as an error after it
	// has downloaded and verified the zip (GOTOOLCHAIN=auto would fetch that
	// Go first). The zip's presence, not the exit status, is what counts.
	cmd := exec.Command("go", "mod", "download", "-json", ModulePath+"@"+ModuleVersion)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-modcacherw", "GOTOOLCHAIN=local")
	out, runErr := cmd.Output()
	var res struct{ Zip, Sum, Error string }
	if err := json.Unmarshal(out, &res); err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %v %v", ModulePath, ModuleVersion, runErr, err)
	}
	if res.Zip == "" || !fileExists(res.Zip) {
		return "", fmt.Errorf("go mod download %s@%s: %v: %s", ModulePath, ModuleVersion, runErr, res.Error)
	}
	return res.Zip, nil
}

func modCache() string {
	if out, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
		if s := strings.TrimSpace(string(out)); s != "" {
			return s
		}
	}
	if s := os.Getenv("GOMODCACHE"); s != "" {
		return s
	}
	if s := os.Getenv("GOPATH"); s != "" {
		return filepath.Join(filepath.SplitList(s)[0], "pkg", "mod")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, "go", "pkg", "mod")
	}
	return ""
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// extract checks the zip against ModuleSum and writes the files of the
// agent's pkg/ebpf/c into dir, unchanged.
func extract(zipPath, dir string) error {
	z, err := zip.OpenReader(zipPath)
	if err != nil {
		return err
	}
	defer z.Close()
	sum, err := hash1(&z.Reader)
	if err != nil {
		return fmt.Errorf("%s: %w", zipPath, err)
	}
	if sum != ModuleSum {
		return fmt.Errorf("%s: hash %s, want %s (%s@%s)", zipPath, sum, ModuleSum, ModulePath, ModuleVersion)
	}
	prefix := ModulePath + "@" + ModuleVersion + "/" + srcDir
	found := 0
	for _, f := range z.File {
		name, ok := strings.CutPrefix(f.Name, prefix)
		if !ok || name == "" || strings.Contains(name, "/") {
			continue
		}
		data, err := readZipFile(f)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
		if name == egressSrc || name == eventsSrc {
			found++
		}
	}
	if found != 2 {
		return fmt.Errorf("%s: %s%s or %s%s missing", zipPath, srcDir, egressSrc, srcDir, eventsSrc)
	}
	return nil
}

func readZipFile(f *zip.File) ([]byte, error) {
	r, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// hash1 is the go.sum hash of a module zip (golang.org/x/mod/sumdb/dirhash's
// Hash1 over the zip's files): the SHA-256 of the sorted lines
// "<sha256 of the file>  <name>\n", base64, with the prefix "h1:".
func hash1(z *zip.Reader) (string, error) {
	files := slices.Clone(z.File)
	slices.SortFunc(files, func(a, b *zip.File) int { return strings.Compare(a.Name, b.Name) })
	summary := sha256.New()
	for _, f := range files {
		if strings.Contains(f.Name, "\n") {
			return "", fmt.Errorf("file name %q contains a newline", f.Name)
		}
		data, err := readZipFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(summary, "%x  %s\n", sha256.Sum256(data), f.Name)
	}
	return "h1:" + base64.StdEncoding.EncodeToString(summary.Sum(nil)), nil
}
