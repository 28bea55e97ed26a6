package masqbpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/enimasq/enimasq/bpf"
)

// Masquerade decisions returned by the masq_decision program (c/masq.c).
const (
	MasqNoSNAT = 0 // the destination is a non-masquerade CIDR
	MasqSNAT   = 1 // masquerade
	MasqPass   = 2 // not IPv4/IPv6, or truncated
)

// MasqDecision is the masquerade decision program bound to a pair of ipmasq
// maps. Run it with BPF_PROG_TEST_RUN on an Ethernet frame.
type MasqDecision struct {
	prog  *ebpf.Program
	owned []*ebpf.Map // placeholder maps made for a disabled family
}

// LoadMasqDecision loads the program using v4 and v6 as its maps. A nil map
// (a family disabled on the node) is replaced by an empty one, so lookups of
// that family always say SNAT.
func LoadMasqDecision(v4, v6 *ebpf.Map) (*MasqDecision, error) {
	spec, err := loadMasq()
	if err != nil {
		return nil, fmt.Errorf("load masq_decision spec: %w", err)
	}
	d := &MasqDecision{}
	replacements := map[string]*ebpf.Map{}
	for name, m := range map[string]*ebpf.Map{"cilium_ipmasq_v4": v4, "cilium_ipmasq_v6": v6} {
		if m == nil {
			var err error
			if m, err = ebpf.NewMap(spec.Maps[name]); err != nil {
				d.Close()
				return nil, fmt.Errorf("placeholder map %s: %w", name, err)
			}
			d.owned = append(d.owned, m)
		}
		replacements[name] = m
	}
	var objs masqObjects
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: replacements}); err != nil {
		d.Close()
		return nil, fmt.Errorf("load masq_decision: %w", err)
	}
	d.prog = objs.MasqDecision
	return d, nil
}

// Decide runs the program on an Ethernet frame and returns its decision.
func (d *MasqDecision) Decide(frame []byte) (uint32, error) {
	ret, err := d.prog.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		return 0, fmt.Errorf("run masq_decision: %w", err)
	}
	return ret, nil
}

// Close releases the program and any placeholder maps.
func (d *MasqDecision) Close() error {
	if d.prog != nil {
		d.prog.Close()
	}
	for _, m := range d.owned {
		m.Close()
	}
	return nil
}

// DecideAddr runs the program on a minimal frame to dst (IPv4 or IPv6).
func (d *MasqDecision) DecideAddr(dst netip.Addr) (uint32, error) {
	return d.Decide(frameTo(dst))
}

// frameTo builds an Ethernet frame with an IPv4 or IPv6 header to dst, the
// source in the documentation ranges. BPF_PROG_TEST_RUN needs no payload.
func frameTo(dst netip.Addr) []byte {
	eth := make([]byte, 14)
	if dst.Is4() {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
		ip := make([]byte, 20)
		ip[0] = 0x45                           // version 4, IHL 5
		binary.BigEndian.PutUint16(ip[2:], 20) // total length
		ip[8], ip[9] = 64, 17                  // TTL, UDP
		copy(ip[12:16], []byte{192, 0, 2, 1})  // source
		copy(ip[16:20], dst.AsSlice())
		return append(eth, ip...)
	}
	binary.BigEndian.PutUint16(eth[12:], 0x86dd)
	ip := make([]byte, 40)
	ip[0] = 0x60 // version 6
	ip[6], ip[7] = 17, 64
	src := netip.MustParseAddr("2001:db8::1").As16()
	copy(ip[8:24], src[:])
	dst16 := dst.As16()
	copy(ip[24:40], dst16[:])
	return append(eth, ip...)
}

// MasqDecideModel is c/masq.c's decision computed in Go from the maps'
// contents: NO_SNAT when the destination's family map has a prefix that
// contains it, SNAT otherwise (also when that map is nil). The script tests
// use it on fake maps, where no program can run.
func MasqDecideModel(v4, v6 bpf.LookupMap, dst netip.Addr) (uint32, error) {
	m := v4
	if !dst.Is4() {
		m = v6
	}
	if bpf.IsNil(m) {
		return MasqSNAT, nil
	}
	key, err := bpf.EncodePrefix(netip.PrefixFrom(dst, dst.BitLen()))
	if err != nil {
		return 0, err
	}
	err = m.Lookup(key, make([]byte, m.ValueSize()))
	switch {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return MasqSNAT, nil
	case err != nil:
		return 0, fmt.Errorf("look up %s: %w", dst, err)
	}
	return MasqNoSNAT, nil
}
