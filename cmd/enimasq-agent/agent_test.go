package main

import (
	"bytes"
	"os"
	"testing"
)

// The flag reference in Documentation/ is generated from the agent's own flag
// set (make docs); it must not drift.
func TestFlagsDocIsUpToDate(t *testing.T) {
	cmd, _ := newAgentCommand(&bytes.Buffer{}, &bytes.Buffer{})
	want := flagsMarkdown(cmd.Flags())
	got, err := os.ReadFile("../../Documentation/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("Documentation/flags.md is out of date: run make docs")
	}
}

func TestOneLineErrors(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--enable-ipv4=false", "--enable-ipv6=false", "--state-dir", t.TempDir()}, &stdout, &stderr); code == 0 {
		t.Fatal("exit 0 with no family enabled")
	}
	lines := bytes.Split(bytes.TrimSpace(stderr.Bytes()), []byte("\n"))
	last := string(lines[len(lines)-1])
	const want = "enimasq-agent: --enable-ipv4 and --enable-ipv6 are both false: enable at least one family"
	if last != want {
		t.Errorf("last line %q, want %q", last, want)
	}
}
