package manifests

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

var root = filepath.Join("..", "..")

func read(t *testing.T, path ...string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(append([]string{root}, path...)...))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestCiliumImage: the Cilium build's Dockerfile builds the agent as the
// tests do (build.sh, agent only), from a Go image pinned by digest at the
// go directive's version, onto Cilium's image at the version of
// cmd/cilium-agent/go.mod; and the context leaves out .git and bin/.
func TestCiliumImage(t *testing.T) {
	df := read(t, "Documentation", "deploy", "cilium", "Dockerfile")
	mod, err := modfile.Parse("go.mod", []byte(read(t, "cmd", "cilium-agent", "go.mod")), nil)
	if err != nil {
		t.Fatal(err)
	}
	cilium := ""
	for _, r := range mod.Require {
		if r.Mod.Path == "github.com/cilium/cilium" {
			cilium = r.Mod.Version
		}
	}
	arg := func(name string) string {
		m := regexp.MustCompile(`(?m)^ARG ` + name + `=(\S+)$`).FindStringSubmatch(df)
		if m == nil {
			t.Fatalf("Dockerfile: no ARG %s", name)
		}
		return m[1]
	}
	if got, want := arg("CILIUM_IMAGE"), "quay.io/cilium/cilium:"+cilium; got != want && !strings.HasPrefix(got, want+"@sha256:") {
		t.Errorf("CILIUM_IMAGE %s, want %s (cmd/cilium-agent/go.mod)", got, want)
	}
	if got := arg("GOLANG_IMAGE"); !regexp.MustCompile(`^docker\.io/library/golang:` + regexp.QuoteMeta(mod.Go.Version) + `@sha256:[0-9a-f]{64}$`).MatchString(got) {
		t.Errorf("GOLANG_IMAGE %s: want golang:%s pinned by digest", got, mod.Go.Version)
	}
	for _, from := range regexp.MustCompile(`(?m)^FROM (\S+)`).FindAllStringSubmatch(df, -1) {
		if !slices.Contains([]string{"${GOLANG_IMAGE}", "${CILIUM_IMAGE}"}, from[1]) {
			t.Errorf("FROM %s: not one of the pinned ARGs", from[1])
		}
	}
	if !strings.Contains(df, "ENIMASQ_CILIUM_AGENT_ONLY=1") || !strings.Contains(df, "cmd/cilium-agent/build.sh /out/cilium-agent") {
		t.Error("the Dockerfile does not build the agent with cmd/cilium-agent/build.sh, as make cilium-agent does")
	}
	build := read(t, "cmd", "cilium-agent", "build.sh")
	for _, want := range []string{"export CGO_ENABLED=0", "pkg/version.ciliumVersion="} {
		if !strings.Contains(build, want) {
			t.Errorf("build.sh: no %q", want)
		}
	}

	ignore := strings.Fields(read(t, ".dockerignore"))
	for _, want := range []string{".git", "bin/"} {
		if !slices.Contains(ignore, want) {
			t.Errorf(".dockerignore does not leave out %s", want)
		}
	}
}
