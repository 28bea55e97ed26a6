package ipmasq

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/enimasq/enimasq/cells/prefixorder"
	"github.com/enimasq/enimasq/cells/strictdecode"
)

// File is the ip-masq-agent config file, YAML or JSON:
//
//	nonMasqueradeCIDRs: [10.0.0.0/8, 172.16.0.0/12]
//	masqLinkLocal: false
//	masqLinkLocalIPv6: false
type File struct {
	NonMasqueradeCIDRs []string `json:"nonMasqueradeCIDRs"`
	MasqLinkLocal      bool     `json:"masqLinkLocal"`
	MasqLinkLocalIPv6  bool     `json:"masqLinkLocalIPv6"`

	// ResyncInterval and CIDRLimit are kubernetes-sigs/ip-masq-agent's
	// fields, with their meaning there, so that its ConfigMaps stay valid:
	// the period of the re-read (a Go duration, e.g. "60s"; instead of
	// --ip-masq-agent-resync-interval), and the most CIDRs the file may list.
	ResyncInterval string `json:"resyncInterval,omitempty"`
	CIDRLimit      *int   `json:"cidrLimit,omitempty"`
}

// MinResyncInterval bounds the file's resyncInterval: a re-read costs a
// file read and a parse.
const MinResyncInterval = time.Second

// Desired is the set of CIDRs a config file puts in effect.
type Desired struct {
	// CIDRs are sorted by prefix, one per prefix.
	CIDRs []CIDR
	// Warnings are accepted oddities (host bits, duplicates, an empty list).
	Warnings []string
	// Summary says where the set came from, for logs and health.
	Summary string
	// ResyncInterval is the file's resyncInterval (0: not set).
	ResyncInterval time.Duration
}

// FromMissingFile is the set in effect when the file (or its directory) does
// not exist: the reserved IPv4 ranges plus link-local.
func FromMissingFile(path string) Desired {
	d := fromFile(File{}, true)
	d.Summary = fmt.Sprintf("%s does not exist: %d default CIDRs", path, len(d.CIDRs))
	return d
}

// Parse decodes and validates a config file. A zero-length file gives the
// defaults of a missing file (the reserved IPv4 ranges and link-local), as
// in Cilium and kubernetes-sigs/ip-masq-agent; a file with only comments, or
// without nonMasqueradeCIDRs, is a file without CIDRs (link-local only), as
// in Cilium. The source reads a file written in place only once it is
// stable, so the empty moment of a rewrite is never read as the defaults.
// Errors name the file, the field and the value.
func Parse(path string, data []byte) (Desired, error) {
	if len(data) == 0 {
		d := fromFile(File{}, true)
		d.Summary = fmt.Sprintf("%s is empty: %d default CIDRs", path, len(d.CIDRs))
		return d, nil
	}
	if len(data) > MaxFileSize {
		return Desired{}, fmt.Errorf("%s: file is larger than %d bytes", path, MaxFileSize)
	}
	f, warnings, err := decode(data)
	if err != nil {
		return Desired{}, fmt.Errorf("%s: %w", path, err)
	}
	d, err := validate(f)
	if err != nil {
		return Desired{}, fmt.Errorf("%s: %w", path, err)
	}
	d.Warnings = append(warnings, d.Warnings...)
	d.Summary = fmt.Sprintf("%s: %d CIDRs", path, len(d.CIDRs))
	return d, nil
}

// decode reads YAML or JSON strictly: a duplicate key, an unknown field or a
// value of the wrong type is an error naming the field and the value. Field
// names match regardless of case, as Cilium's and kubernetes-sigs'
// encoding/json decoding does (a file they accept stays valid), with a
// warning naming the field's spelling; a field given twice is an error.
// The common form takes strictdecode's fast reader.
func decode(data []byte) (File, []string, error) {
	var f File
	warnings, err := fileDecoder.DecodeDocument(data, &f)
	return f, warnings, err
}

// decodeFast is decode by strictdecode's fast readers alone; false when
// they decline.
func decodeFast(data []byte) (File, bool) {
	var f File
	return f, fileDecoder.DecodeFast(data, &f)
}

// decodeFull is decode by the YAML library alone, for any input: what the
// fast readers are held to.
func decodeFull(data []byte) (File, []string, error) {
	var f File
	warnings, err := fileDecoder.DecodeLibrary(data, &f)
	return f, warnings, err
}

// fileDecoder decodes the file strictly, field names regardless of case;
// the errors of a value of the wrong type say what its fields hold.
var fileDecoder = strictdecode.Decoder{FoldCase: true, Holds: map[string]string{
	"nonMasqueradeCIDRs": "a list of CIDR strings",
	"resyncInterval":     "a duration string",
	"cidrLimit":          "a whole number",
}}

// validate checks every CIDR of a decoded file.
func validate(f File) (Desired, error) {
	var warnings []string
	field := func(i int) string { return fmt.Sprintf("nonMasqueradeCIDRs[%d]", i) }
	// Parse every item (the first bad one is the error), then find the
	// duplicates by sorting: no map for the usual list of distinct CIDRs,
	// and the CIDRs come out sorted.
	type item struct {
		p        netip.Prefix
		i        int
		hostBits bool
	}
	items := make([]item, len(f.NonMasqueradeCIDRs))
	odd := false // host bits or duplicates: warnings to write
	for i, s := range f.NonMasqueradeCIDRs {
		p, err := parsePrefix(s)
		if err != nil {
			return Desired{}, fmt.Errorf("field %s: value %q is not a CIDR: %w", field(i), s, err)
		}
		if p.Addr().Is4In6() {
			return Desired{}, fmt.Errorf("field %s: value %q is an IPv4-mapped IPv6 prefix: write it as IPv4", field(i), s)
		}
		items[i] = item{p: p.Masked(), i: i, hostBits: p.Masked() != p}
		odd = odd || items[i].hostBits
	}
	sorted := items
	if !slices.IsSortedFunc(items, func(a, b item) int { return prefixorder.Compare(a.p, b.p) }) {
		sorted = slices.Clone(items)
		slices.SortStableFunc(sorted, func(a, b item) int { return prefixorder.Compare(a.p, b.p) })
	}
	cidrs := make([]netip.Prefix, 0, len(sorted))
	var dupOf map[int]int // item -> the first item with its prefix
	first := 0
	for k, it := range sorted {
		if k > 0 && sorted[k-1].p == it.p {
			if dupOf == nil {
				dupOf = map[int]int{}
			}
			dupOf[it.i] = first
			odd = true
			continue
		}
		first = it.i
		cidrs = append(cidrs, it.p)
	}
	if odd {
		for i, it := range items {
			if it.hostBits {
				warnings = append(warnings, fmt.Sprintf("%s: %q has host bits set: using %s", field(i), f.NonMasqueradeCIDRs[i], it.p))
			}
			if j, dup := dupOf[i]; dup {
				warnings = append(warnings, fmt.Sprintf("%s: %s is listed twice (also nonMasqueradeCIDRs[%d])", field(i), it.p, j))
			}
		}
	}
	if f.CIDRLimit != nil {
		switch limit := *f.CIDRLimit; {
		case limit < 0:
			return Desired{}, fmt.Errorf("field cidrLimit: value %d is negative", limit)
		case len(f.NonMasqueradeCIDRs) > limit:
			return Desired{}, fmt.Errorf("field nonMasqueradeCIDRs: %d CIDRs listed, more than cidrLimit %d", len(f.NonMasqueradeCIDRs), limit)
		}
	}
	d := fromCIDRs(cidrs, f)
	if f.ResyncInterval != "" {
		period, err := time.ParseDuration(strings.TrimSpace(f.ResyncInterval))
		switch {
		case err != nil:
			return Desired{}, fmt.Errorf("field resyncInterval: value %q is not a duration (e.g. \"60s\")", f.ResyncInterval)
		case period < MinResyncInterval:
			return Desired{}, fmt.Errorf("field resyncInterval: value %q is below %s", f.ResyncInterval, MinResyncInterval)
		}
		d.ResyncInterval = period
	}
	if len(f.NonMasqueradeCIDRs) == 0 {
		warnings = append(warnings, "nonMasqueradeCIDRs is empty: only link-local traffic is exempt from masquerading "+
			"(Cilium behaves the same; a missing or zero-byte file gives the reserved-range defaults)")
	}
	d.Warnings = append(warnings, d.Warnings...)

	var v4, v6 int
	for _, c := range d.CIDRs {
		if c.Prefix.Addr().Is4() {
			v4++
		} else {
			v6++
		}
	}
	for _, fam := range []struct {
		name string
		n    int
	}{{"IPv4", v4}, {"IPv6", v6}} {
		if fam.n > MaxCIDRsPerFamily {
			return Desired{}, fmt.Errorf("field nonMasqueradeCIDRs: %d %s CIDRs (link-local included) is more than the BPF map holds (%d)",
				fam.n, fam.name, MaxCIDRsPerFamily)
		}
	}
	return d, nil
}

// fromFile is the set for a file without CIDRs to validate: the defaults
// when useDefaults (a missing or zero-byte file), plus link-local.
func fromFile(f File, useDefaults bool) Desired {
	d := fromCIDRs(nil, f)
	if useDefaults {
		for _, p := range DefaultNonMasqCIDRs {
			d.CIDRs = append(d.CIDRs, CIDR{Prefix: p, Source: SourceDefault})
		}
		sortCIDRs(d.CIDRs)
	}
	return d
}

// fromCIDRs builds the rows: the configured CIDRs, then link-local unless the
// file asks to masquerade it (a link-local CIDR also listed keeps "config").
// cidrs are distinct and sorted (prefixorder.Compare); so are the rows.
func fromCIDRs(cidrs []netip.Prefix, f File) Desired {
	rows := make([]CIDR, len(cidrs), len(cidrs)+2)
	for i, p := range cidrs {
		rows[i] = CIDR{Prefix: p, Source: SourceConfig}
	}
	for _, ll := range []struct {
		p    netip.Prefix
		masq bool
	}{{LinkLocalV4, f.MasqLinkLocal}, {LinkLocalV6, f.MasqLinkLocalIPv6}} {
		at, listed := slices.BinarySearchFunc(rows, ll.p, func(c CIDR, p netip.Prefix) int { return prefixorder.Compare(c.Prefix, p) })
		if !ll.masq && !listed {
			rows = slices.Insert(rows, at, CIDR{Prefix: ll.p, Source: SourceLinkLocal})
		}
	}
	return Desired{CIDRs: rows}
}

func sortCIDRs(rows []CIDR) {
	slices.SortFunc(rows, func(a, b CIDR) int { return prefixorder.Compare(a.Prefix, b.Prefix) })
}

// Encode writes the file that gives back the configured part of d: its
// config rows, and the link-local switches. Used by tests (round trip) and
// the demo.
func Encode(d Desired) ([]byte, error) {
	f := File{NonMasqueradeCIDRs: []string{}, MasqLinkLocal: true, MasqLinkLocalIPv6: true}
	for _, c := range d.CIDRs {
		switch c.Source {
		case SourceConfig:
			f.NonMasqueradeCIDRs = append(f.NonMasqueradeCIDRs, c.Prefix.String())
		case SourceLinkLocal:
			if c.Prefix == LinkLocalV4 {
				f.MasqLinkLocal = false
			} else {
				f.MasqLinkLocalIPv6 = false
			}
		}
	}
	return yaml.Marshal(f)
}
