package ciliumnode

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestParseSampleCiliumNode(t *testing.T) {
	n, err := ReadCiliumNodeFile("../../test/testdata/samples/ciliumnode.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if n.Name != "ip-10-130-0-10.ec2.internal" || n.FirstInterfaceIndex != 1 || len(n.ENIs) != 3 || len(n.Warnings) != 0 {
		t.Fatalf("parsed %+v", n)
	}
	var rows []string
	for _, e := range n.ENIs {
		rows = append(rows, strings.Join(e.TableRow(), " "))
	}
	want := []string{
		"eni-0a1b2c3d4e5f00000 0 10 0a:58:0a:82:00:0a 10.130.0.0/20 10.130.0.1 10.128.0.0/13,100.112.0.0/13 0 Skipped: number 0 < first-interface-index 1",
		"eni-0a1b2c3d4e5f00001 1 11 0a:58:0a:82:64:0a 10.130.96.0/20 10.130.96.1 10.128.0.0/13,100.112.0.0/13 3 Usable",
		"eni-0a1b2c3d4e5f00002 2 12 0a:58:0a:82:70:0a 10.130.112.0/20 10.130.112.1 10.128.0.0/13,100.112.0.0/13 2 Usable",
	}
	if !slices.Equal(rows, want) {
		t.Errorf("ENIs:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	if got := n.Summary(); got != "CiliumNode ip-10-130-0-10.ec2.internal: 3 ENIs (2 usable, first-interface-index 1), 5 pool IPs" {
		t.Errorf("summary %q", got)
	}
}

const minimalNode = `
spec:
  ipam:
    pool:
      10.0.1.5: {resource: eni-1}
status:
  eni:
    enis:
      eni-1: {id: eni-1, mac: "0A:58:0A:82:64:0A", number: 0, subnet: {cidr: 10.0.0.0/20}, vpc: {primary-cidr: 10.0.0.0/16}}
`

func TestParseCiliumNodeFields(t *testing.T) {
	n, err := ParseCiliumNode("node", []byte(minimalNode))
	if err != nil {
		t.Fatal(err)
	}
	e := n.ENIs[0]
	if e.MAC != "0a:58:0a:82:64:0a" || e.Gateway != netip.MustParseAddr("10.0.0.1") || !e.Usable() || e.RouteTable() != 10 ||
		!slices.Equal(e.Pool, []netip.Addr{netip.MustParseAddr("10.0.1.5")}) {
		t.Errorf("ENI %+v", e)
	}

	// JSON works too, and first-interface-index skips ENIs below it.
	n, err = ParseCiliumNode("node", []byte(`{"spec":{"eni":{"first-interface-index":1},"ipam":{"pool":{"10.0.1.5":{"resource":"eni-1"}}}},
		"status":{"eni":{"enis":{"eni-1":{"mac":"0a:58:0a:82:64:0a","number":0,"subnet":{"cidr":"10.0.0.0/20"}}}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if n.ENIs[0].Usable() || n.PoolSize() != 0 {
		t.Errorf("ENI 0 with first-interface-index 1: %+v", n.ENIs[0])
	}

	// Warnings: a pool IP of an unknown ENI, host bits in a subnet.
	n, err = ParseCiliumNode("node", []byte(strings.NewReplacer(
		"10.0.0.0/20", "10.0.0.7/20", "10.0.1.5: {resource: eni-1}", "10.0.1.5: {resource: eni-1}\n      10.0.1.6: {resource: eni-9}",
	).Replace(minimalNode)))
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Warnings) != 2 || !strings.Contains(n.Warnings[0], "eni-9") || !strings.Contains(n.Warnings[1], "host bits") {
		t.Errorf("warnings %q", n.Warnings)
	}
}

// Cilium's ENI type has `number,omitempty`: the first ENI (number 0) comes
// without a number from the API server and from kubectl.
func TestParseCiliumNodeNumberZeroIsOmitted(t *testing.T) {
	n, err := ParseCiliumNode("f", []byte(strings.Replace(minimalNode, "number: 0, ", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if len(n.ENIs) != 1 || n.ENIs[0].Number != 0 || n.ENIs[0].RouteTable() != 10 {
		t.Errorf("ENIs %+v: want eni-1 with number 0, table 10", n.ENIs)
	}
}

func TestParseCiliumNodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"empty", minimalNode, "", "file is empty"},
		{"not yaml", minimalNode, "spec: [", "not a CiliumNode"},
		{"wrong type", "number: 0", "number: zero", "number"},
		{"list", "spec:", "kind: List\nspec:", `kind "List"`},
		{"bad mac", `"0A:58:0A:82:64:0A"`, `"0A:58"`, `status.eni.enis[eni-1].mac: "0A:58" is not an Ethernet MAC address`},
		{"two without a number", "      eni-1:", "      eni-0: {mac: \"0a:58:0a:82:64:0b\", subnet: {cidr: 10.0.16.0/20}}\n      eni-1:", "eni-0 and eni-1 both have number 0"},
		{"negative number", "number: 0", "number: -1", "is negative"},
		{"number into the main table", "number: 0", "number: 244", "would be a reserved table"},
		{"bad subnet", "cidr: 10.0.0.0/20", "cidr: 10.0.0.0/33", "status.eni.enis[eni-1].subnet.cidr"},
		{"no subnet", "subnet: {cidr: 10.0.0.0/20}, ", "", "subnet.cidr"},
		{"bad vpc", "primary-cidr: 10.0.0.0/16", "primary-cidr: x", "vpc.primary-cidr"},
		{"id differs", "{id: eni-1,", "{id: eni-2,", `differs from its key`},
		{"bad pool ip", "10.0.1.5: {", "10.0.1.500: {", `spec.ipam.pool[10.0.1.500]: "10.0.1.500" is not an IP address`},
		{"no resource", "{resource: eni-1}", "{}", "spec.ipam.pool[10.0.1.5].resource: empty"},
		{"negative first index", "spec:", "spec:\n  eni: {first-interface-index: -1}", "first-interface-index: -1 is negative"},
		{"same number", "      eni-1:", "      eni-0: {mac: \"0a:58:0a:82:64:0b\", number: 0, subnet: {cidr: 10.0.16.0/20}}\n      eni-1:", "eni-0 and eni-1 both have number 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := strings.Replace(minimalNode, tc.old, tc.new, 1)
			if in == minimalNode {
				t.Fatalf("test case does not change the input")
			}
			_, err := ParseCiliumNode("node.yaml", []byte(in))
			if err == nil {
				t.Fatalf("accepted:\n%s", in)
			}
			if !strings.HasPrefix(err.Error(), "node.yaml: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to name the file and contain %q", err, tc.want)
			}
		})
	}
}

// FuzzParseCiliumNode: no input panics, and an accepted CiliumNode is
// consistent: ENIs sorted by number with distinct numbers and MACs parsed,
// each pool IP on exactly one ENI, gateways inside their subnets, skipped
// ENIs exactly those below first-interface-index, and parsing is
// deterministic.
func FuzzParseCiliumNode(f *testing.F) {
	sample, err := os.ReadFile("../../test/testdata/samples/ciliumnode.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		string(sample), minimalNode, "", "kind: CiliumNode", "status: {eni: {enis: {a: {number: 1}}}}",
		`{"spec":{"ipam":{"pool":{"::1":{"resource":"e"}}}},"status":{"eni":{"enis":{"e":{"mac":"02:00:00:00:00:01","number":3,"subnet":{"cidr":"::/127"}}}}}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := ParseCiliumNode("fuzz", data)
		if err != nil {
			return
		}
		again, err := ParseCiliumNode("fuzz", data)
		if err != nil || len(again.ENIs) != len(n.ENIs) || !slices.Equal(again.Warnings, n.Warnings) {
			t.Fatalf("not deterministic: %v", err)
		}
		seenIP := map[netip.Addr]bool{}
		for i, e := range n.ENIs {
			if !e.Equal(again.ENIs[i]) {
				t.Fatalf("not deterministic: %+v vs %+v", e, again.ENIs[i])
			}
			if i > 0 && n.ENIs[i-1].Number >= e.Number {
				t.Fatalf("ENIs not sorted by distinct number: %d then %d", n.ENIs[i-1].Number, e.Number)
			}
			if !e.Subnet.Contains(e.Gateway) || e.Subnet.Masked() != e.Subnet {
				t.Fatalf("gateway %s outside subnet %s", e.Gateway, e.Subnet)
			}
			if (e.Number < n.FirstInterfaceIndex) == e.Usable() {
				t.Fatalf("ENI %d usable=%t with first-interface-index %d", e.Number, e.Usable(), n.FirstInterfaceIndex)
			}
			if !slices.IsSortedFunc(e.Pool, netip.Addr.Compare) {
				t.Fatalf("pool not sorted: %v", e.Pool)
			}
			for _, ip := range e.Pool {
				if why := unusablePoolIP(ip, e, nil); why != "" {
					t.Fatalf("%s handed out: %s", ip, why)
				}
				if seenIP[ip] {
					t.Fatalf("%s on two ENIs", ip)
				}
				seenIP[ip] = true
			}
		}
	})
}

// The IPs an ENI holds (status.eni.enis[].ip, addresses, prefixes and
// ipv6-prefixes) are what Cilium's ENI IPAM places an IP by; a value that is
// not an address or a CIDR is refused naming its field. status.ipam.used,
// which Cilium v1.20 clears, is a known field and not read.
func TestParseCiliumNodeAddresses(t *testing.T) {
	node := `
spec: {}
status:
  ipam:
    used:
      10.0.1.5: {owner: shop/db-0, resource: eni-1}
  eni:
    enis:
      eni-1:
        id: eni-1
        ip: 10.0.1.4
        mac: "0a:58:0a:82:64:0a"
        subnet: {cidr: 10.0.0.0/20}
        addresses: [10.0.1.6, 10.0.1.5]
        prefixes: [10.0.2.16/28]
        ipv6-prefixes: ["2600:1f14::/80"]
`
	n, err := ParseCiliumNode("f", []byte(node))
	if err != nil {
		t.Fatal(err)
	}
	e := n.ENIs[0]
	if want := []netip.Addr{netip.MustParseAddr("10.0.1.5"), netip.MustParseAddr("10.0.1.6")}; !slices.Equal(e.Addresses, want) {
		t.Errorf("addresses %v, want %v (sorted)", e.Addresses, want)
	}
	for ip, want := range map[string]bool{
		"10.0.1.4": true, "10.0.1.5": true, "10.0.1.6": true, "10.0.2.17": true, "2600:1f14::5": true,
		"10.0.1.7": false, "10.0.2.32": false, "2600:1f14:0:0:1::": false,
	} {
		if got := e.Holds(netip.MustParseAddr(ip)); got != want {
			t.Errorf("eni-1 holds %s: %t, want %t", ip, got, want)
		}
	}
	for _, tc := range []struct{ field, value string }{
		{"addresses", "10.0.1.500"},
		{"prefixes", "10.0.2.16"},
		{"ipv6-prefixes", "2600:1f14::/129"},
	} {
		bad := strings.Replace(minimalNode, "number: 0,", "number: 0, "+tc.field+": [\""+tc.value+"\"],", 1)
		_, err := ParseCiliumNode("f", []byte(bad))
		if want := "status.eni.enis[eni-1]." + tc.field + "[0]: \"" + tc.value + "\""; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s %q: %v, want an error naming %s", tc.field, tc.value, err, want)
		}
	}
}

// TestParseCiliumNodeRefusesUnusablePoolIPs: each class of address that no
// pod may have is refused with its own reason, on the ENI's row and in the
// CiliumNode's refusals; the ENI keeps its other pool IPs.
func TestParseCiliumNodeRefusesUnusablePoolIPs(t *testing.T) {
	const node = `
spec:
  ipam:
    pool:
      10.0.1.5: {resource: eni-1}
      %s: {resource: eni-1}
status:
  eni:
    enis:
      eni-1: {id: eni-1, ip: 10.0.0.10, mac: "0a:58:0a:82:64:0a", number: 1, subnet: {cidr: 10.0.0.0/20}}
      eni-2: {id: eni-2, ip: 10.0.16.10, mac: "0a:58:0a:82:64:0b", number: 2, subnet: {cidr: 10.0.16.0/20}}
`
	for _, tc := range []struct{ ip, why string }{
		{"0.0.0.0", "the unspecified address"},
		{"127.0.0.1", "a loopback address"},
		{"224.0.0.1", "a multicast address"},
		{"169.254.0.7", "a link-local address"},
		{"255.255.255.255", "the broadcast address"},
		{"10.0.32.7", "outside the subnet 10.0.0.0/20 of eni-1"},
		{"10.0.0.0", "the network address of the subnet 10.0.0.0/20"},
		{"10.0.0.1", "the gateway of the subnet 10.0.0.0/20"},
		{"10.0.15.255", "the broadcast address of the subnet 10.0.0.0/20"},
		{"10.0.0.10", "the primary IP of eni-1"},
		{"'::'", "the unspecified address"},
		{"'fe80::1'", "a link-local address"},
	} {
		t.Run(tc.ip, func(t *testing.T) {
			n, err := ParseCiliumNode("node.yaml", []byte(fmt.Sprintf(node, tc.ip)))
			if err != nil {
				t.Fatal(err)
			}
			ip := netip.MustParseAddr(strings.Trim(tc.ip, "'"))
			e := n.ENIs[0]
			if want := []RefusedIP{{IP: ip, Reason: tc.why}}; !slices.Equal(e.Refused, want) {
				t.Errorf("refused %v, want %v", e.Refused, want)
			}
			if !slices.Equal(e.Pool, []netip.Addr{netip.MustParseAddr("10.0.1.5")}) {
				t.Errorf("pool %v: the good IP must stay, the bad one go", e.Pool)
			}
			want := fmt.Sprintf("spec.ipam.pool[%s]: %s refused: %s", ip, ip, tc.why)
			if !slices.Equal(n.Refused, []string{want}) {
				t.Errorf("refusals %q, want %q", n.Refused, want)
			}
			if row := strings.Join(e.TableRow(), " "); !strings.Contains(row, "refused "+ip.String()+" ("+tc.why+")") {
				t.Errorf("the enis row does not say it: %s", row)
			}
		})
	}
	// One IP under two spellings: refused under both, as it could go to
	// two pods.
	n, err := ParseCiliumNode("node.yaml", []byte(strings.Replace(
		"spec: {ipam: {pool: {'fd00::5': {resource: eni-1}, 'fd00:0::5': {resource: eni-1}}}}\n"+
			"status: {eni: {enis: {eni-1: {mac: '0a:58:0a:82:64:0a', number: 1, subnet: {cidr: 'fd00::/64'}}}}}", "", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if len(n.ENIs[0].Pool) != 0 || len(n.Refused) != 2 || !strings.Contains(n.Refused[0], "listed 2 times (fd00:0::5, fd00::5)") {
		t.Errorf("pool %v, refusals %q", n.ENIs[0].Pool, n.Refused)
	}
}

// TestParseCiliumNodeStrict: a key given twice, or a field cilium.io/v2
// does not have, is an error that names it (the whole file is refused: its
// last good version stays in force).
func TestParseCiliumNodeStrict(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"second status", minimalNode + "status: {}\n", `duplicate key "status" at line 10`},
		{"pool IP twice", strings.Replace(minimalNode, "      10.0.1.5: {resource: eni-1}", "      10.0.1.5: {resource: eni-1}\n      10.0.1.5: {resource: eni-2}", 1), `duplicate key "10.0.1.5" at line 6`},
		{"json duplicate", `{"spec": {}, "spec": {}}`, `duplicate key "spec" at line 1`},
		{"second document", minimalNode + "---\n" + minimalNode, "a second document at line 10"},
		{"two JSON values", `{"spec": {}} {"spec": {"ipam": {"pool": {"10.0.1.9": {"resource": "eni-1"}}}}}`, "data after the first value"},
		{"unknown field", strings.Replace(minimalNode, "number: 0", "number: 0, nunber: 1", 1), `field status.eni.enis.eni-1.nunber: unknown field "nunber"`},
		{"unknown top level", minimalNode + "statos: {}\n", `unknown field "statos"`},
		{"unknown metadata", "metadata: {name: node-1, nmae: node-2}\n" + minimalNode, `field metadata.nmae: unknown field "nmae"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseCiliumNode("node.yaml", []byte(tc.in))
			if err == nil || !strings.HasPrefix(err.Error(), "node.yaml: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to name the file and contain %q", err, tc.want)
			}
		})
	}
}
