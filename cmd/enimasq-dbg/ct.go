package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// bpfCTCommand is `bpf ct list`: the connections the policy programs track
// (the pinned enimasq_policy_ct), as `cilium-dbg bpf ct list global`.
func bpfCTCommand(o *options) *cobra.Command {
	ct := &cobra.Command{Use: "ct", Short: "The connections the policy programs track (enimasq_policy_ct)"}
	var format string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the tracked connections: device, protocol, pod and peer with their ports, who opened it, last seen",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := openPinned(bpfRootOf(o), policybpf.PolicyCTMapName)
			if err != nil {
				return err
			}
			defer m.Close()
			conns, err := listConnections(m)
			if err != nil {
				return err
			}
			names := deviceNames(o)
			for i := range conns {
				conns[i].Device = names(conns[i].Ifindex)
			}
			if format != "" {
				return printAs(cmd.OutOrStdout(), format, conns)
			}
			t := newTable(cmd.OutOrStdout(), "IFINDEX", "DEVICE", "PROTO", "POD", "PEER", "OPENED BY", "LAST SEEN")
			for _, c := range conns {
				t.row(strconv.Itoa(int(c.Ifindex)), orDash(c.Device), policybpf.ProtocolName(uint32(c.Protocol)),
					hostPort(c.Pod, c.PodPort, c.Protocol), hostPort(c.Peer, c.PeerPort, c.Protocol), c.OpenedBy,
					(time.Duration(c.AgeSeconds*float64(time.Second))).Round(time.Millisecond).String()+" ago")
			}
			return t.flush()
		},
	}
	outputFlag(list, &format)
	ct.AddCommand(list)
	return ct
}

// connection is a tracked connection: its key (policybpf.PolicyConnection) and
// its value, as list prints it.
type connection struct {
	Ifindex  uint32     `json:"ifindex"`
	Device   string     `json:"device,omitempty"`
	Protocol uint8      `json:"protocol"`
	Pod      netip.Addr `json:"pod"`
	PodPort  uint16     `json:"podPort"`
	Peer     netip.Addr `json:"peer"`
	PeerPort uint16     `json:"peerPort"`
	// OpenedBy is the pod's direction that opened it: egress or ingress.
	OpenedBy string `json:"openedBy"`
	// EchoRequests is, for an ICMP echo, the pod's direction its requests
	// take (egress or ingress; the replies that pass go the other way),
	// empty for other protocols.
	EchoRequests string `json:"echoRequests,omitempty"`
	// AgeSeconds is the time since the programs last saw a packet of it.
	AgeSeconds float64 `json:"ageSeconds"`
}

func hostPort(a netip.Addr, port uint16, proto uint8) string {
	switch uint32(proto) {
	case policybpf.ProtocolTCP, policybpf.ProtocolUDP, policybpf.ProtocolSCTP:
		return netip.AddrPortFrom(a, port).String()
	case 1, 58:
		return fmt.Sprintf("%s id %d", a, port)
	}
	return a.String()
}

// ctValueSize is struct ct_value of bpf/policybpf/c/policy.c: {u64 last_seen; u32
// opened_by; u32 pad}; the key is policybpf.PolicyCTKeySize bytes, decoded by
// policybpf.ParsePolicyCTKey.
const ctValueSize = 16

// listConnections reads every tracked connection, sorted by device, pod,
// peer, protocol and ports.
func listConnections(m *ebpf.Map) ([]connection, error) {
	if m.KeySize() != policybpf.PolicyCTKeySize || m.ValueSize() != ctValueSize {
		return nil, fmt.Errorf("%s has keys of %d bytes and values of %d, this enimasq-dbg reads %d and %d: another version's layout",
			policybpf.PolicyCTMapName, m.KeySize(), m.ValueSize(), policybpf.PolicyCTKeySize, ctValueSize)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, err
	}
	now := uint64(ts.Nano())
	out := []connection{}
	var (
		key   = make([]byte, policybpf.PolicyCTKeySize)
		value = make([]byte, ctValueSize)
	)
	// A hash map is walked by keys; one evicted under the walk restarts
	// it, so the walk is bounded.
	var cursor any
	for range m.MaxEntries() + 1 {
		if err := m.NextKey(cursor, key); errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("list %s: %w", policybpf.PolicyCTMapName, err)
		}
		cursor = slices.Clone(key)
		if err := m.Lookup(key, value); errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", policybpf.PolicyCTMapName, err)
		}
		c, ok := policybpf.ParsePolicyCTKey(key)
		if !ok {
			return nil, fmt.Errorf("%s: a key of family %d: another version's layout?", policybpf.PolicyCTMapName, key[37])
		}
		conn := connection{Ifindex: c.Ifindex, Protocol: c.Protocol, Pod: c.Pod, PodPort: c.PodPort, Peer: c.Peer, PeerPort: c.PeerPort,
			OpenedBy: "egress"}
		if c.EchoRequests != 0 {
			conn.EchoRequests = c.EchoRequests.String()
		}
		if binary.NativeEndian.Uint32(value[8:]) == 2 {
			conn.OpenedBy = "ingress"
		}
		if seen := binary.NativeEndian.Uint64(value[0:]); seen <= now {
			conn.AgeSeconds = float64(now-seen) / 1e9
		}
		out = append(out, conn)
	}
	slices.SortFunc(out, func(a, b connection) int {
		if a.Ifindex != b.Ifindex {
			return int(a.Ifindex) - int(b.Ifindex)
		}
		if c := a.Pod.Compare(b.Pod); c != 0 {
			return c
		}
		if c := a.Peer.Compare(b.Peer); c != 0 {
			return c
		}
		if c := int(a.Protocol)*1<<32 + int(a.PodPort)<<16 + int(a.PeerPort) - (int(b.Protocol)*1<<32 + int(b.PodPort)<<16 + int(b.PeerPort)); c != 0 {
			return c
		}
		return strings.Compare(a.EchoRequests, b.EchoRequests)
	})
	return out, nil
}
