package policybpf

import (
	"log/slog"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/enimasq/enimasq/bpf"
)

// The test helpers of package bpf's tests that these use too.

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func openPinnedForTest(tb testing.TB, spec *ebpf.MapSpec, dir string) *ebpf.Map {
	tb.Helper()
	m, err := bpf.OpenPinned(discardLogger(), spec, dir)
	if err != nil {
		tb.Fatalf("OpenPinned(%s): %v", spec.Name, err)
	}
	tb.Cleanup(func() { m.Close() })
	return m
}
