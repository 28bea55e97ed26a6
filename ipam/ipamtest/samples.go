// Package ipamtest holds what the tests of ipam's parts share: the sample
// inputs of test/testdata/samples, read as the agent reads them. For tests
// only.
package ipamtest

import (
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipmasq"
)

// samplesDir is test/testdata/samples of the module.
func samplesDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "test", "testdata", "samples")
}

// Prefixes parses prefixes, failing the test on a bad one.
func Prefixes(t testing.TB, ss ...string) []netip.Prefix {
	t.Helper()
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = p
	}
	return out
}

// Samples are the sample CiliumNode and the non-masquerade CIDRs of the
// sample ip-masq-agent config.
func Samples(t testing.TB) (*ciliumnode.CiliumNode, []netip.Prefix) {
	t.Helper()
	n, err := ciliumnode.ReadCiliumNodeFile(filepath.Join(samplesDir(), "ciliumnode.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(samplesDir(), "ip-masq-agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := ipmasq.Parse("sample", data)
	if err != nil {
		t.Fatal(err)
	}
	var cidrs []netip.Prefix
	for _, c := range d.CIDRs {
		cidrs = append(cidrs, c.Prefix)
	}
	return n, cidrs
}
