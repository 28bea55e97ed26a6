package awspeer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/ringbuf"
)

// The program and map names of the agent's sources.
const (
	ProgramName       = "handle_egress"
	EgressMapName     = "egress_map"
	CPEgressMapName   = "cp_egress_map"
	PodStateMapName   = "egress_pod_state_map"
	ConntrackMapName  = "aws_conntrack_map"
	EventsMapName     = "policy_events"
	sharedMapsSection = ".bss"
)

// Verdicts: the program returns BPF_OK (TC_ACT_OK) or BPF_DROP (TC_ACT_SHOT).
const (
	VerdictOK   uint32 = 0
	VerdictShot uint32 = 2
)

// PodState is a value of egress_pod_state_map.
type PodState uint8

const (
	PoliciesApplied PodState = 0
	DefaultAllow    PodState = 1
	DefaultDeny     PodState = 2
)

// The keys of egress_pod_state_map (POD_STATE_MAP_KEY,
// CLUSTER_POLICY_POD_STATE_MAP_KEY).
const (
	networkPolicyStateKey uint32 = 0
	clusterPolicyStateKey uint32 = 1
)

// Peer is one instance of the AWS agent's egress program with maps of its
// own (nothing pinned).
type Peer struct {
	coll   *ebpf.Collection
	prog   *ebpf.Program
	egress *ebpf.Map
	cp     *ebpf.Map
	state  *ebpf.Map
	ct     *ebpf.Map
	events *ebpf.Map
	reader *ringbuf.Reader
	filler *ebpf.Program
}

// New builds the agent's programs (once a process) and loads the egress
// program with new maps. Its errors wrap ErrMissingTools when the machine
// lacks what the build needs.
func New() (*Peer, error) {
	objs, err := build()
	if err != nil {
		return nil, err
	}
	spec, err := collectionSpec(objs)
	if err != nil {
		return nil, err
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load %s: %+v", egressSrc, ve)
		}
		return nil, fmt.Errorf("load %s: %w", egressSrc, err)
	}
	p := &Peer{
		coll:   coll,
		prog:   coll.Programs[ProgramName],
		egress: coll.Maps[EgressMapName],
		cp:     coll.Maps[CPEgressMapName],
		state:  coll.Maps[PodStateMapName],
		ct:     coll.Maps[ConntrackMapName],
		events: coll.Maps[EventsMapName],
	}
	if p.prog == nil || p.egress == nil || p.cp == nil || p.state == nil || p.ct == nil || p.events == nil {
		coll.Close()
		return nil, fmt.Errorf("load %s: program or map missing from %v", egressSrc, coll)
	}
	return p, nil
}

// collectionSpec is the egress object's collection as the agent's loader
// (aws-ebpf-sdk-go) would load it; see the package comment.
func collectionSpec(objs objects) (*ebpf.CollectionSpec, error) {
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(objs.egress))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", egressSrc, err)
	}
	events, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(objs.events))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", eventsSrc, err)
	}
	for _, s := range []*ebpf.CollectionSpec{spec, events} {
		for _, m := range s.Maps {
			if err := dropPinning(m); err != nil {
				return nil, err
			}
		}
	}

	// The maps the egress object declares without a section (tentative
	// definitions, in .bss) are the events object's, shared by name.
	shared := map[uint64]string{}
	for name, v := range spec.Variables {
		if v.SectionName == sharedMapsSection {
			shared[uint64(v.Offset)] = name
			delete(spec.Variables, name)
		}
	}
	prog := spec.Programs[ProgramName]
	if prog == nil {
		return nil, fmt.Errorf("%s: no program %s", egressSrc, ProgramName)
	}
	for i := range prog.Instructions {
		ins := &prog.Instructions[i]
		if ins.Reference() != sharedMapsSection {
			continue
		}
		if !ins.IsLoadFromMap() || ins.Src != asm.PseudoMapValue {
			return nil, fmt.Errorf("%s: instruction %d: unexpected reference to %s: %v", egressSrc, i, sharedMapsSection, *ins)
		}
		off := uint64(ins.Constant) >> 32
		name, ok := shared[off]
		if !ok {
			return nil, fmt.Errorf("%s: instruction %d: no symbol at %s+%d", egressSrc, i, sharedMapsSection, off)
		}
		if events.Maps[name] == nil {
			return nil, fmt.Errorf("%s: %s references %s, which %s does not define", egressSrc, ProgramName, name, eventsSrc)
		}
		ins.Src = asm.PseudoMapFD
		ins.Constant = 0
		*ins = ins.WithReference(name)
		spec.Maps[name] = events.Maps[name]
	}
	delete(spec.Maps, sharedMapsSection)
	// SEC("tc_cls"), a section name of the agent's loader: a tc classifier.
	if prog.Type == ebpf.UnspecifiedProgram {
		prog.Type = ebpf.SchedCLS
	}
	if prog.Type != ebpf.SchedCLS {
		return nil, fmt.Errorf("%s: %s is a %s program", egressSrc, ProgramName, prog.Type)
	}
	return spec, nil
}

// dropPinning removes the two fields struct bpf_map_def_pvt has after
// libbpf's struct bpf_map_def (pinning, inner_map_fd) from a legacy map
// definition: cilium/ebpf refuses non-zero trailing bytes, and the maps are
// not pinned here.
func dropPinning(m *ebpf.MapSpec) error {
	if m.Extra == nil {
		return nil
	}
	extra, err := io.ReadAll(m.Extra)
	if err != nil {
		return err
	}
	if len(extra) != 8 {
		return fmt.Errorf("map %s: %d bytes after the map definition, want 8 (pinning, inner_map_fd)", m.Name, len(extra))
	}
	if inner := binary.NativeEndian.Uint32(extra[4:]); inner != 0 {
		return fmt.Errorf("map %s: inner_map_fd %d", m.Name, inner)
	}
	m.Extra = nil
	m.Pinning = ebpf.PinNone
	return nil
}

// Close releases the program and its maps.
func (p *Peer) Close() error {
	var errs []error
	if p.reader != nil {
		errs = append(errs, p.reader.Close())
	}
	if p.filler != nil {
		errs = append(errs, p.filler.Close())
	}
	p.coll.Close()
	return errors.Join(errs...)
}

// Program is handle_egress.
func (p *Peer) Program() *ebpf.Program { return p.prog }

// Map is one of the program's maps by name (EgressMapName, ...).
func (p *Peer) Map(name string) *ebpf.Map { return p.coll.Maps[name] }

// SetPodState writes the pod's network policy and cluster policy states, as
// the agent's UpdatePodStateEbpfMaps does. A pod the agent enforces network
// policies on and no cluster policy is (PoliciesApplied, DefaultAllow).
func (p *Peer) SetPodState(networkPolicy, clusterPolicy PodState) error {
	if err := p.state.Put(networkPolicyStateKey, uint8(networkPolicy)); err != nil {
		return fmt.Errorf("%s: %w", PodStateMapName, err)
	}
	if err := p.state.Put(clusterPolicyStateKey, uint8(clusterPolicy)); err != nil {
		return fmt.Errorf("%s: %w", PodStateMapName, err)
	}
	return nil
}

// AddNetworkPolicy writes egress_map's entry for a peer CIDR (see
// NetworkPolicyValue).
func (p *Peer) AddNetworkPolicy(cidr netip.Prefix, rules []PortRule) error {
	key, err := TrieKey(cidr)
	if err != nil {
		return err
	}
	val, err := NetworkPolicyValue(rules)
	if err != nil {
		return err
	}
	if err := p.egress.Put(key, val); err != nil {
		return fmt.Errorf("%s %s: %w", EgressMapName, cidr, err)
	}
	return nil
}

// AddClusterPolicy writes cp_egress_map's entry for a peer CIDR (see
// ClusterPolicyValue).
func (p *Peer) AddClusterPolicy(cidr netip.Prefix, rules []ClusterRule) error {
	key, err := TrieKey(cidr)
	if err != nil {
		return err
	}
	val, err := ClusterPolicyValue(rules)
	if err != nil {
		return err
	}
	if err := p.cp.Put(key, val); err != nil {
		return fmt.Errorf("%s %s: %w", CPEgressMapName, cidr, err)
	}
	return nil
}

// Run runs frame through the program repeat times in one BPF_PROG_TEST_RUN
// and returns the last run's verdict and the kernel's time per run.
func (p *Peer) Run(frame []byte, repeat int) (verdict uint32, perRun time.Duration, err error) {
	return p.prog.Benchmark(frame, repeat, nil)
}

// ResetConntrack empties aws_conntrack_map. It walks the whole table (its
// 524,288 buckets), about a millisecond: for one connection, Forget.
func (p *Peer) ResetConntrack() error {
	var keys [][]byte
	var key, val []byte
	it := p.ct.Iterate()
	for it.Next(&key, &val) {
		keys = append(keys, bytes.Clone(key))
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("%s: %w", ConntrackMapName, err)
	}
	for _, k := range keys {
		if err := p.ct.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("%s: %w", ConntrackMapName, err)
		}
	}
	return nil
}

// ConntrackLen is the number of aws_conntrack_map entries.
func (p *Peer) ConntrackLen() (int, error) {
	n := 0
	var key, val []byte
	it := p.ct.Iterate()
	for it.Next(&key, &val) {
		n++
	}
	return n, it.Err()
}

// Forget deletes the connection the program tracks for frame (its
// conntrack_key: the frame's 5-tuple, owner_ip its source, ifindex 1, the
// loopback device BPF_PROG_TEST_RUN runs a frame on). It fails with
// ebpf.ErrKeyNotExist when there is none.
func (p *Peer) Forget(frame []byte) error {
	key, err := conntrackKey(frame, loopbackIfindex)
	if err != nil {
		return err
	}
	if err := p.ct.Delete(key); err != nil {
		return fmt.Errorf("%s: %w", ConntrackMapName, err)
	}
	return nil
}

// The ifindex of every network namespace's loopback device (the kernel's
// LOOPBACK_IFINDEX), the device of a BPF_PROG_TEST_RUN frame without context.
const loopbackIfindex = 1

// conntrackKey is the program's struct conntrack_key for an Ethernet + IPv4 +
// TCP, UDP or SCTP frame: src_ip, src_port (u16, 2 bytes of padding), dest_ip,
// dest_port, protocol (1 byte of padding), owner_ip, ifindex; addresses as
// the packet has them, ports in host order, padding zero (the program
// memsets the key).
func conntrackKey(frame []byte, ifindex uint32) ([]byte, error) {
	if len(frame) < 14+20+4 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 || frame[14]>>4 != 4 {
		return nil, errors.New("not an Ethernet + IPv4 frame with ports")
	}
	ip := frame[14:34]
	l4 := frame[34:]
	key := make([]byte, 24)
	copy(key[0:4], ip[12:16])
	binary.NativeEndian.PutUint16(key[4:], binary.BigEndian.Uint16(l4[0:]))
	copy(key[8:12], ip[16:20])
	binary.NativeEndian.PutUint16(key[12:], binary.BigEndian.Uint16(l4[2:]))
	key[14] = ip[9]
	copy(key[16:20], ip[12:16])
	binary.NativeEndian.PutUint32(key[20:], ifindex)
	return key, nil
}

// Tier is the tier of an event (the agent's utils.Tier).
type Tier uint8

const (
	TierError Tier = iota
	TierAdmin
	TierNetworkPolicy
	TierBaseline
	TierDefault
)

// Event is a policy_events record (struct data_t).
type Event struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint32
	Protocol         uint32
	Verdict          uint32 // 1 allowed, 0 denied
	PacketSize       uint32
	Egress           bool
	Tier             Tier
}

// eventSize is sizeof(struct data_t): seven __u32, two __u8, padded to 4.
const eventSize = 32

// Events reads and consumes the records in policy_events.
func (p *Peer) Events() ([]Event, error) {
	if p.reader == nil {
		r, err := ringbuf.NewReader(p.events)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EventsMapName, err)
		}
		p.reader = r
	}
	var out []Event
	for {
		p.reader.SetDeadline(time.Now())
		rec, err := p.reader.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("%s: %w", EventsMapName, err)
		}
		s := rec.RawSample
		if len(s) < eventSize {
			return out, fmt.Errorf("%s: a %d-byte record", EventsMapName, len(s))
		}
		u := func(i int) uint32 { return binary.NativeEndian.Uint32(s[4*i:]) }
		addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte(s[4*i : 4*i+4])) }
		out = append(out, Event{
			Src: addr(0), SrcPort: u(1), Dst: addr(2), DstPort: u(3),
			Protocol: u(4), Verdict: u(5), PacketSize: u(6),
			Egress: s[28] != 0, Tier: Tier(s[29]),
		})
	}
}

// FillEvents fills policy_events with records the size of the program's, so
// that every bpf_ringbuf_output of the program fails: a node where the agent
// runs with --enable-policy-event-logs=false (its default) never reads the
// ring, which stays full. Events drains it.
func (p *Peer) FillEvents() error {
	if p.filler == nil {
		load := asm.LoadMapPtr(asm.R1, 0)
		if err := load.AssociateMap(p.events); err != nil {
			return err
		}
		insns := asm.Instructions{}
		for off := int16(-eventSize); off < 0; off += 4 {
			insns = append(insns, asm.StoreImm(asm.RFP, off, 0, asm.Word))
		}
		insns = append(insns,
			load,
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -eventSize),
			asm.Mov.Imm(asm.R3, eventSize),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnRingbufOutput.Call(),
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		)
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type: ebpf.SchedCLS, License: "GPL", Instructions: insns,
		})
		if err != nil {
			return fmt.Errorf("fill %s: %w", EventsMapName, err)
		}
		p.filler = prog
	}
	// A record takes its size and an 8-byte header, rounded up to 8.
	records := int(p.events.MaxEntries())/(eventSize+8) + 1
	frame := make([]byte, 14)
	if _, _, err := p.filler.Benchmark(frame, records, nil); err != nil {
		return fmt.Errorf("fill %s: %w", EventsMapName, err)
	}
	return nil
}
