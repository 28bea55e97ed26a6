package ipmasq

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// fastSeeds are inputs in and just outside the form decodeFast reads.
var fastSeeds = []string{
	"nonMasqueradeCIDRs:\n- 10.0.0.0/8\n- 172.16.0.0/12\nmasqLinkLocal: false\n",
	"nonMasqueradeCIDRs:\n  - 10.0.0.0/8\n  - 2001:db8::/32\nmasqLinkLocalIPv6: true\n",
	"# comment\nnonMasqueradeCIDRs:\n\n- 10.0.0.0/8\n# between\n- 10.1.2.3/8\ncidrLimit: 10\nresyncInterval: 1m30s\n",
	"nonMasqueradeCIDRs: []\nmasqLinkLocal: true\n",
	"nonMasqueradeCIDRs:\nmasqLinkLocal: true\n",
	"masqLinkLocal: true\n",
	"nonMasqueradeCIDRs:\n- 10.0.0.0/8\n  - 10.0.0.0/8\n",
	"nonMasqueradeCIDRs:\n- 10.0.0.0/8 # c\n",
	"nonMasqueradeCIDRs:\n- '10.0.0.0/8'\n",
	"nonMasqueradeCIDRs:\n- 10.0.0.0/8\nnonMasqueradeCIDRs:\n- 10.0.0.0/8\n",
	"NonMasqueradeCIDRs:\n- 10.0.0.0/8\n",
	"nonMasqueradeCIDRs:\n- 10.0.0.0/8",
	"cidrLimit: 010\n",
	"cidrLimit: 0\nresyncInterval: 1.5h\n",
	"resyncInterval: 60\n",
	"masqLinkLocal: yes\n",
	"nonMasqueradeCIDRs:\n- ::/0\n- 1:2/3\n- 0/0\n",
	"nonMasqueradeCIDRs:\r\n- 10.0.0.0/8\r\n",
}

// FuzzDecodeFast: whatever decodeFast accepts, the YAML decoder accepts
// with the same File and no warnings.
func FuzzDecodeFast(f *testing.F) {
	for _, s := range fastSeeds {
		f.Add([]byte(s))
	}
	f.Add(benchFile(50))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFastAgrees(t, data)
	})
}

func checkFastAgrees(t *testing.T, data []byte) {
	t.Helper()
	fast, ok := decodeFast(data)
	if !ok {
		return
	}
	full, warnings, err := decodeFull(data)
	if err != nil {
		t.Fatalf("%q: fast path accepted, the YAML decoder refused: %s", data, err)
	}
	if len(warnings) > 0 {
		t.Fatalf("%q: fast path accepted, the YAML decoder warns %q", data, warnings)
	}
	if !reflect.DeepEqual(fast, full) {
		t.Fatalf("%q:\nfast %#v\nfull %#v", data, fast, full)
	}
}

// The seeds, and the generated large files, agree; the common form takes
// the fast path.
func TestDecodeFastAgrees(t *testing.T) {
	for _, s := range fastSeeds {
		checkFastAgrees(t, []byte(s))
	}
	for _, s := range []string{fastSeeds[0], fastSeeds[1], fastSeeds[2], fastSeeds[3], string(benchFile(MaxCIDRsPerFamily - 1))} {
		if _, ok := decodeFast([]byte(s)); !ok {
			t.Errorf("fast path refused the common form %q", s[:min(len(s), 80)])
		}
	}
	for _, s := range []string{"NonMasqueradeCIDRs:\n- 10.0.0.0/8\n", "nonMasqueradeCIDRs:\n- 10.0.0.0/8\nnonMasqueradeCIDRs: []\n"} {
		if _, ok := decodeFast([]byte(s)); ok {
			t.Errorf("fast path accepted %q, which needs the full decoder's warning or error", s)
		}
	}
	// Through Parse, the errors still name the item.
	_, err := Parse("f", []byte("nonMasqueradeCIDRs:\n- 10.0.0.0/8\n- 10.0.0.0/33\n"))
	if err == nil || !strings.Contains(err.Error(), `f: field nonMasqueradeCIDRs[1]: value "10.0.0.0/33" is not a CIDR`) {
		t.Errorf("bad item on the fast path: %v", err)
	}
}

func BenchmarkParse16383(b *testing.B) {
	data := benchFile(MaxCIDRsPerFamily - 1)
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			if _, ok := decodeFast(data); !ok {
				b.Fatal("refused")
			}
		}
	})
	b.Run("yaml", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := decodeFull(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Parse", func(b *testing.B) {
		for b.Loop() {
			if _, err := Parse("f", data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzParsePrefix: whatever the IPv4 fast path accepts, netip.ParsePrefix
// reads the same.
func FuzzParsePrefix(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8", "0.0.0.0/0", "255.255.255.255/32", "01.0.0.0/8", "1.2.3.4/08", "1.2.3.4/33", "256.0.0.0/8", " 1.2.3.4/8", "1.2.3/8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fast, ok := parsePrefix4(s)
		if !ok {
			return
		}
		full, err := netip.ParsePrefix(s)
		if err != nil || full != fast {
			t.Fatalf("%q: fast %v, netip %v, %v", s, fast, full, err)
		}
	})
}
