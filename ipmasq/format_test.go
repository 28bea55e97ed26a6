package ipmasq

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseErrorsNameFileFieldAndValue(t *testing.T) {
	const path = "/etc/config/ip-masq-agent"
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"bad CIDR", "nonMasqueradeCIDRs: [10.0.0.0/8, 10.0.0.0/33]", []string{path, "nonMasqueradeCIDRs[1]", `"10.0.0.0/33"`}},
		{"not a CIDR", `{"nonMasqueradeCIDRs": ["banana"]}`, []string{path, "nonMasqueradeCIDRs[0]", `"banana"`}},
		{"4in6", `nonMasqueradeCIDRs: ["::ffff:10.0.0.0/104"]`, []string{path, "nonMasqueradeCIDRs[0]", "IPv4-mapped"}},
		{"bool type", "masqLinkLocal: 3", []string{path, "masqLinkLocal", "3", "not a boolean"}},
		{"list type", "nonMasqueradeCIDRs: {a: b}", []string{path, "nonMasqueradeCIDRs", `{"a":"b"}`}},
		{"list item type", "nonMasqueradeCIDRs: [[10.0.0.0/8]]", []string{path, "nonMasqueradeCIDRs", "not a list of CIDR strings"}},
		{"unknown field", "nonMasqCIDRs: []", []string{path, `unknown field "nonMasqCIDRs"`}},
		{"duplicate key", "masqLinkLocal: true\nmasqLinkLocal: false", []string{path, "not valid YAML", "masqLinkLocal"}},
		{"bad YAML", "nonMasqueradeCIDRs: [", []string{path, "not valid YAML"}},
		{"second document", "nonMasqueradeCIDRs: [10.0.0.0/8]\n---\nnonMasqueradeCIDRs: [192.168.0.0/16]\n", []string{path, "a second document at line 2"}},
		{"two JSON values", `{"nonMasqueradeCIDRs": []} {"nonMasqueradeCIDRs": ["10.0.0.0/8"]}`, []string{path, "data after the first value"}},
		{"scalar", "42", []string{path, "want a mapping", "42"}},
		{"too big", "#" + strings.Repeat("x", MaxFileSize), []string{path, "larger than 1048576 bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(path, []byte(tc.file))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// kubernetes-sigs/ip-masq-agent's ConfigMap fields keep their meaning:
// resyncInterval is the re-read period, more CIDRs than cidrLimit are
// refused.
func TestParseSigsFields(t *testing.T) {
	d, err := Parse("f", []byte("nonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16]\ncidrLimit: 64\nresyncInterval: 90s\n"))
	if err != nil || d.ResyncInterval != 90*time.Second {
		t.Errorf("resyncInterval 90s: %v, %v", d.ResyncInterval, err)
	}
	for _, tc := range []struct{ file, want string }{
		{"nonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16]\ncidrLimit: 1\n", "field nonMasqueradeCIDRs: 2 CIDRs listed, more than cidrLimit 1"},
		{"nonMasqueradeCIDRs: []\ncidrLimit: -1\n", "field cidrLimit: value -1 is negative"},
		{"cidrLimit: many\n", "field cidrLimit: value \"many\" is not a whole number"},
		{"resyncInterval: soon\n", `field resyncInterval: value "soon" is not a duration`},
		{"nonMasqueradeCIDRs: []\nNonMasqueradeCIDRs: [10.0.0.0/8]\n", `field nonMasqueradeCIDRs is given twice ("NonMasqueradeCIDRs" and "nonMasqueradeCIDRs")`},
		{"resyncInterval: 1ms\n", `field resyncInterval: value "1ms" is below 1s`},
	} {
		if _, err := Parse("/etc/config/ip-masq-agent", []byte(tc.file)); err == nil ||
			!strings.Contains(err.Error(), "/etc/config/ip-masq-agent: "+tc.want) {
			t.Errorf("%q: got %v, want %q", tc.file, err, tc.want)
		}
	}
}

func TestParseSemantics(t *testing.T) {
	rows := func(d Desired) []string {
		var out []string
		for _, c := range d.CIDRs {
			out = append(out, c.Prefix.String()+" "+string(c.Source))
		}
		return out
	}
	for _, tc := range []struct {
		name, file string
		want       []string
		warning    string
	}{
		{"comments only is a file without fields (Cilium)", "# nothing yet\n", []string{"169.254.0.0/16 link-local", "fe80::/10 link-local"}, "is empty"},
		{"empty list", "nonMasqueradeCIDRs: []", []string{"169.254.0.0/16 link-local", "fe80::/10 link-local"}, "nonMasqueradeCIDRs is empty"},
		{"null list", "nonMasqueradeCIDRs: null\nmasqLinkLocal: null", []string{"169.254.0.0/16 link-local", "fe80::/10 link-local"}, "is empty"},
		{"no link-local", "{nonMasqueradeCIDRs: [10.0.0.0/8], masqLinkLocal: true, masqLinkLocalIPv6: true}", []string{"10.0.0.0/8 config"}, ""},
		{"host bits", "nonMasqueradeCIDRs: [10.1.2.3/8]\nmasqLinkLocal: true\nmasqLinkLocalIPv6: true", []string{"10.0.0.0/8 config"}, `"10.1.2.3/8" has host bits set: using 10.0.0.0/8`},
		{"duplicate", "nonMasqueradeCIDRs: [10.0.0.0/8, 10.0.0.0/8]\nmasqLinkLocal: true\nmasqLinkLocalIPv6: true", []string{"10.0.0.0/8 config"}, "listed twice"},
		{"field names regardless of case, as Cilium", "nonMasqueradeCIDRS: [10.0.0.0/8]\nmasqLinkLocal: true\nmasqLinkLocalIPv6: true", []string{"10.0.0.0/8 config"}, `field "nonMasqueradeCIDRS" is read as nonMasqueradeCIDRs`},
		{"cidrLimit and resyncInterval of kubernetes-sigs", "nonMasqueradeCIDRs: [10.0.0.0/8]\ncidrLimit: 1\nresyncInterval: 60s\nmasqLinkLocal: true\nmasqLinkLocalIPv6: true", []string{"10.0.0.0/8 config"}, ""},
		{"listed link-local is config", "nonMasqueradeCIDRs: [fe80::/10]\nmasqLinkLocal: true", []string{"fe80::/10 config"}, ""},
		{"sorted v4 then v6", "nonMasqueradeCIDRs: ['2001:db8::/32', 10.0.0.0/16, 10.0.0.0/8]\nmasqLinkLocal: true\nmasqLinkLocalIPv6: true",
			[]string{"10.0.0.0/8 config", "10.0.0.0/16 config", "2001:db8::/32 config"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Parse("f", []byte(tc.file))
			if err != nil {
				t.Fatal(err)
			}
			got := rows(d)
			want := slices.Clone(tc.want)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("rows\n got %v\nwant %v", got, want)
			}
			if tc.warning != "" && !slices.ContainsFunc(d.Warnings, func(w string) bool { return strings.Contains(w, tc.warning) }) {
				t.Errorf("warnings %q lack %q", d.Warnings, tc.warning)
			}
			if tc.warning == "" && len(d.Warnings) > 0 {
				t.Errorf("unexpected warnings %q", d.Warnings)
			}
		})
	}
}

// The peers' own cases of a zero-byte file: Cilium (pkg/ipmasq,
// readConfig: `len(raw) == 0` is an empty config, given the default
// non-masquerade CIDRs and link-local) and kubernetes-sigs/ip-masq-agent
// (syncConfig: the defaults, overwritten only by the fields a file has):
// a zero-byte file gives what a missing file gives, and masqLinkLocal
// keeps its default (false: link-local exempt).
func TestPeerCasesZeroByteFileGivesTheDefaults(t *testing.T) {
	missing := FromMissingFile("f").CIDRs
	for _, tc := range []struct{ name, peer string }{
		{"Cilium: an empty config file adds the default non-masquerade CIDRs", "cilium"},
		{"kubernetes-sigs: an empty file keeps the default config", "kubernetes-sigs"},
		{"Cilium and kubernetes-sigs: an empty file exempts link-local (masqLinkLocal false)", "both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Parse("/etc/config/ip-masq-agent", []byte{})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(d.CIDRs, missing) {
				t.Errorf("rows\n got %v\nwant %v (the file missing)", d.CIDRs, missing)
			}
			if tc.peer == "both" && (!slices.ContainsFunc(d.CIDRs, func(c CIDR) bool { return c.Prefix == LinkLocalV4 }) ||
				!slices.ContainsFunc(d.CIDRs, func(c CIDR) bool { return c.Prefix == LinkLocalV6 })) {
				t.Errorf("link-local not exempt: %v", d.CIDRs)
			}
			if len(d.Warnings) > 0 || !strings.Contains(d.Summary, "13 default CIDRs") {
				t.Errorf("warnings %q, summary %q", d.Warnings, d.Summary)
			}
		})
	}
}

// A missing file gives the reserved ranges.
func TestMissingFileGivesTheDefaults(t *testing.T) {
	var got []string
	for _, c := range FromMissingFile("f").CIDRs {
		got = append(got, c.Prefix.String()+" "+string(c.Source))
	}
	want := append(defaultRows(), "169.254.0.0/16 link-local", "fe80::/10 link-local")
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("rows\n got %v\nwant %v", got, want)
	}
}

func defaultRows() []string {
	var out []string
	for _, p := range DefaultNonMasqCIDRs {
		out = append(out, p.String()+" default")
	}
	return out
}

func TestParseLimitsCIDRsPerFamilyToTheMapSize(t *testing.T) {
	file := func(n int, masqLinkLocal bool) []byte {
		var b strings.Builder
		fmt.Fprintf(&b, "masqLinkLocal: %t\nnonMasqueradeCIDRs:\n", masqLinkLocal)
		for i := range n {
			fmt.Fprintf(&b, "- %s/32\n", netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
		}
		return []byte(b.String())
	}
	if _, err := Parse("f", file(MaxCIDRsPerFamily, true)); err != nil {
		t.Errorf("16384 v4 CIDRs without link-local: %s", err)
	}
	_, err := Parse("f", file(MaxCIDRsPerFamily, false))
	if err == nil || !strings.Contains(err.Error(), "16385 IPv4 CIDRs (link-local included)") {
		t.Errorf("16384 v4 CIDRs plus link-local: %v", err)
	}
}

// FuzzParse: no input panics, and an accepted file's rows, written back out
// and parsed again, give the same rows.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"", "nonMasqueradeCIDRs: []", "nonMasqueradeCIDRs: [10.0.0.0/8, '2001:db8::1/32']\nmasqLinkLocal: true",
		`{"nonMasqueradeCIDRs":["192.168.0.0/16"],"masqLinkLocalIPv6":true}`, "masqLinkLocal: [", "- a",
		"nonMasqueradeCIDRs: [169.254.0.0/16, 10.1.2.3/8, 10.0.0.0/8]",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Parse("fuzz", data)
		if err != nil || len(data) == 0 {
			return // zero bytes: the defaults, which Encode does not write
		}
		out, err := Encode(d)
		if err != nil {
			t.Fatalf("encode %v: %s", d.CIDRs, err)
		}
		again, err := Parse("fuzz", out)
		if err != nil {
			t.Fatalf("re-parse of %q: %s", out, err)
		}
		if !slices.Equal(d.CIDRs, again.CIDRs) {
			t.Fatalf("round trip changed rows:\n%v\n%v", d.CIDRs, again.CIDRs)
		}
	})
}
