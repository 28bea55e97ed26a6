package ciliumnode

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/enimasq/enimasq/cells/strictdecode"
)

// MaxENINumber keeps the ENI route table (10+number) below the kernel's
// reserved tables 253-255.
const MaxENINumber = 242

// MaxCiliumNodeSize bounds the CiliumNode file.
const MaxCiliumNodeSize = 4 << 20

// CiliumNode is what enimasq reads from a CiliumNode object.
type CiliumNode struct {
	Name                string
	FirstInterfaceIndex int
	// ENIs are sorted by number, then ID; each carries its pool IPs.
	ENIs []*ENI
	// Warnings are accepted oddities (pool IPs of unknown ENIs, host bits).
	Warnings []string
	// Refused are the pool IPs that cannot be pod IPs, each with its field
	// and why; the rest of the node is in use (see unusablePoolIP).
	Refused []string
}

// PoolSize is the number of IPs handed out (on usable ENIs).
func (n *CiliumNode) PoolSize() int {
	size := 0
	for _, e := range n.ENIs {
		if e.Usable() {
			size += len(e.Pool)
		}
	}
	return size
}

// Summary is a one-line description for logs and health.
func (n *CiliumNode) Summary() string {
	usable := 0
	for _, e := range n.ENIs {
		if e.Usable() {
			usable++
		}
	}
	return fmt.Sprintf("CiliumNode %s: %d ENIs (%d usable, first-interface-index %d), %d pool IPs",
		n.Name, len(n.ENIs), usable, n.FirstInterfaceIndex, n.PoolSize())
}

// ParseCiliumNode decodes a CiliumNode (YAML or JSON) and validates the
// fields enimasq reads. Errors name the file, the field and the value.
func ParseCiliumNode(path string, data []byte) (*CiliumNode, error) {
	n, err := parseCiliumNode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

func parseCiliumNode(data []byte) (*CiliumNode, error) {
	switch {
	case len(strings.TrimSpace(string(data))) == 0:
		return nil, fmt.Errorf("file is empty")
	case len(data) > MaxCiliumNodeSize:
		return nil, fmt.Errorf("file is larger than %d bytes", MaxCiliumNodeSize)
	}
	var f ciliumNodeObject
	if err := (strictdecode.Decoder{}).Decode(data, &f); err != nil {
		if errors.Is(err, strictdecode.ErrSyntax) {
			return nil, fmt.Errorf("not a CiliumNode: %w", err)
		}
		return nil, err
	}
	if f.Kind != "" && f.Kind != "CiliumNode" {
		return nil, fmt.Errorf("kind %q: want a single CiliumNode (kubectl get ciliumnode NODE -o yaml)", f.Kind)
	}
	n := &CiliumNode{Name: f.Name}
	if fii := f.Spec.ENI.FirstInterfaceIndex; fii != nil {
		if *fii < 0 {
			return nil, fmt.Errorf("spec.eni.first-interface-index: %d is negative", *fii)
		}
		n.FirstInterfaceIndex = *fii
	}

	byID := map[string]*ENI{}
	byNumber := map[int]string{}
	for _, key := range slices.Sorted(maps.Keys(f.Status.ENI.ENIs)) {
		st := f.Status.ENI.ENIs[key]
		field := fmt.Sprintf("status.eni.enis[%s]", key)
		e, warnings, err := parseENI(field, key, st)
		if err != nil {
			return nil, err
		}
		n.Warnings = append(n.Warnings, warnings...)
		if other, dup := byNumber[e.Number]; dup {
			a, b := min(other, e.ID), max(other, e.ID)
			return nil, fmt.Errorf("status.eni.enis: %s and %s both have number %d (they would share route table %d)",
				a, b, e.Number, e.RouteTable())
		}
		byNumber[e.Number] = e.ID
		if e.Number < n.FirstInterfaceIndex {
			e.Skipped = fmt.Sprintf("number %d < first-interface-index %d", e.Number, n.FirstInterfaceIndex)
		}
		byID[e.ID] = e
	}

	primaries := map[netip.Addr]string{}
	for _, e := range byID {
		if e.PrimaryIP.IsValid() {
			primaries[e.PrimaryIP] = e.ID
		}
	}
	listed := map[netip.Addr][]string{} // an IP under several spellings
	for ipStr := range f.Spec.IPAM.Pool {
		if ip, err := netip.ParseAddr(ipStr); err == nil {
			listed[ip] = append(listed[ip], ipStr)
		}
	}
	for _, ipStr := range slices.Sorted(maps.Keys(f.Spec.IPAM.Pool)) {
		entry := f.Spec.IPAM.Pool[ipStr]
		field := fmt.Sprintf("spec.ipam.pool[%s]", ipStr)
		ip, err := netip.ParseAddr(ipStr)
		if err != nil || ip.Zone() != "" || ip.Is4In6() {
			return nil, fmt.Errorf("%s: %q is not an IP address", field, ipStr)
		}
		if entry.Resource == "" {
			return nil, fmt.Errorf("%s.resource: empty: the ENI holding the IP is not known", field)
		}
		e, ok := byID[entry.Resource]
		if !ok {
			n.Warnings = append(n.Warnings, fmt.Sprintf("%s: ENI %s is not in status.eni.enis: IP not used", field, entry.Resource))
			continue
		}
		why := unusablePoolIP(ip, e, primaries)
		if spellings := listed[ip]; why == "" && len(spellings) > 1 {
			slices.Sort(spellings)
			why = fmt.Sprintf("listed %d times (%s): it would go to two pods", len(spellings), strings.Join(spellings, ", "))
		}
		if why != "" {
			e.Refused = append(e.Refused, RefusedIP{IP: ip, Reason: why})
			n.Refused = append(n.Refused, fmt.Sprintf("%s: %s refused: %s", field, ip, why))
			continue
		}
		e.Pool = append(e.Pool, ip)
	}

	for _, e := range byID {
		slices.SortFunc(e.Pool, netip.Addr.Compare)
		slices.SortFunc(e.Refused, func(a, b RefusedIP) int { return a.IP.Compare(b.IP) })
		n.ENIs = append(n.ENIs, e)
	}
	slices.SortFunc(n.ENIs, func(a, b *ENI) int {
		if c := cmp.Compare(a.Number, b.Number); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	slices.Sort(n.Warnings)
	slices.Sort(n.Refused)
	return n, nil
}

// unusablePoolIP says why ip cannot be a pod IP on e ("" when it can): an
// address no pod may have, or one the ENI's subnet or the node holds
// already. A pod rule "from 0.0.0.0" or "from the gateway" would reroute
// the node's own traffic.
func unusablePoolIP(ip netip.Addr, e *ENI, primaries map[netip.Addr]string) string {
	switch {
	case ip.IsUnspecified():
		return "the unspecified address"
	case ip.IsLoopback():
		return "a loopback address"
	case ip.IsMulticast():
		return "a multicast address"
	case ip.IsLinkLocalUnicast():
		return "a link-local address"
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	case !e.Subnet.Contains(ip):
		return fmt.Sprintf("outside the subnet %s of %s", e.Subnet, e.ID)
	case ip == e.Subnet.Addr():
		return fmt.Sprintf("the network address of the subnet %s", e.Subnet)
	case ip == e.Gateway:
		return fmt.Sprintf("the gateway of the subnet %s", e.Subnet)
	case ip.Is4() && ip == lastAddr(e.Subnet):
		return fmt.Sprintf("the broadcast address of the subnet %s", e.Subnet)
	case primaries[ip] != "":
		return fmt.Sprintf("the primary IP of %s", primaries[ip])
	}
	return ""
}

// lastAddr is the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func parseENI(field, key string, st eniStatus) (*ENI, []string, error) {
	var warnings []string
	e := &ENI{ID: st.ID}
	switch {
	case e.ID == "":
		e.ID = key
	case e.ID != key:
		return nil, nil, fmt.Errorf("%s.id: %q differs from its key %q", field, st.ID, key)
	}
	if st.Number == nil {
		// Cilium writes the number with omitempty: no number is ENI 0.
		zero := 0
		st.Number = &zero
	}
	if *st.Number < 0 {
		return nil, nil, fmt.Errorf("%s.number: %d is negative", field, *st.Number)
	}
	// The ENI's route table is 10+number: 253-255 are the kernel's default,
	// main and local tables, which enimasq must never write.
	if *st.Number > MaxENINumber {
		return nil, nil, fmt.Errorf("%s.number: %d is above %d (its route table 10+number would be a reserved table)", field, *st.Number, MaxENINumber)
	}
	e.Number = *st.Number

	mac, err := net.ParseMAC(st.MAC)
	if err != nil || len(mac) != 6 {
		return nil, nil, fmt.Errorf("%s.mac: %q is not an Ethernet MAC address", field, st.MAC)
	}
	e.MAC = mac.String()

	if st.IP != "" {
		if e.PrimaryIP, err = netip.ParseAddr(st.IP); err != nil {
			return nil, nil, fmt.Errorf("%s.ip: %q is not an IP address", field, st.IP)
		}
	}

	subnet, err := netip.ParsePrefix(st.Subnet.CIDR)
	if err != nil {
		return nil, nil, fmt.Errorf("%s.subnet.cidr: %q is not a CIDR (the gateway is its first address)", field, st.Subnet.CIDR)
	}
	if subnet.Masked() != subnet {
		warnings = append(warnings, fmt.Sprintf("%s.subnet.cidr: %s has host bits set: using %s", field, subnet, subnet.Masked()))
		subnet = subnet.Masked()
	}
	gw := subnet.Addr().Next()
	if !gw.IsValid() || !subnet.Contains(gw) {
		return nil, nil, fmt.Errorf("%s.subnet.cidr: %s has no first address for the gateway", field, subnet)
	}
	e.Subnet, e.Gateway = subnet, gw

	if st.VPC.PrimaryCIDR != "" {
		p, err := netip.ParsePrefix(st.VPC.PrimaryCIDR)
		if err != nil {
			return nil, nil, fmt.Errorf("%s.vpc.primary-cidr: %q is not a CIDR", field, st.VPC.PrimaryCIDR)
		}
		e.VPCPrimaryCIDR = p.Masked()
	}
	for i, s := range st.VPC.CIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, nil, fmt.Errorf("%s.vpc.cidrs[%d]: %q is not a CIDR", field, i, s)
		}
		e.VPCCIDRs = append(e.VPCCIDRs, p.Masked())
	}
	for i, s := range st.Addresses {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return nil, nil, fmt.Errorf("%s.addresses[%d]: %q is not an IP address", field, i, s)
		}
		e.Addresses = append(e.Addresses, a.Unmap())
	}
	slices.SortFunc(e.Addresses, netip.Addr.Compare)
	for _, list := range []struct {
		name     string
		prefixes []string
	}{{"prefixes", st.Prefixes}, {"ipv6-prefixes", st.IPv6Prefixes}} {
		for i, s := range list.prefixes {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, nil, fmt.Errorf("%s.%s[%d]: %q is not a CIDR", field, list.name, i, s)
			}
			e.Prefixes = append(e.Prefixes, p.Masked())
		}
	}
	return e, warnings, nil
}
