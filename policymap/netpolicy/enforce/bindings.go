package enforce

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/cells/tablesync"
)

// BindingsTableName is the name of the table of the pods' source bindings.
const BindingsTableName = "policy-bindings"

// Binding is a pod address bound to the device the node routes it to (a
// host route of the main table to a veth), whatever the pod's policy and
// whether or not its device carries the programs: the programs drop a
// packet that claims a local pod's address and did not come from its
// device (bpf/c/policy.c spoofed()). It is the entry of the address in
// enimasq_policy_pods.
type Binding struct {
	Addr    netip.Addr
	Device  string
	Ifindex int
	Status  reconciler.Status
}

func (b *Binding) Clone() *Binding { c := *b; return &c }

func (b *Binding) GetStatus() reconciler.Status { return b.Status }

func (b *Binding) SetStatus(s reconciler.Status) *Binding {
	b.Status = s
	return b
}

// sameDesired compares everything but the status.
func (b *Binding) sameDesired(o *Binding) bool {
	return b.Addr == o.Addr && b.Device == o.Device && b.Ifindex == o.Ifindex
}

func (b *Binding) TableHeader() []string {
	return []string{"Pod", "Device", "Ifindex", "Status", "Error"}
}

func (b *Binding) TableRow() []string {
	return []string{b.Addr.String(), b.Device, strconv.Itoa(b.Ifindex), b.Status.Kind.String(), b.Status.GetError()}
}

// BindingAddrIndex is the primary index: the pod address.
var BindingAddrIndex = tablesync.StringIndex("pod", func(b *Binding) string { return b.Addr.String() })

// NewBindingsTable creates and registers the bindings table.
func NewBindingsTable(db *statedb.DB) (statedb.RWTable[*Binding], error) {
	return statedb.NewTable(db, BindingsTableName, BindingAddrIndex)
}

// bindingRows syncs the bindings table with the derived bindings.
var bindingRows = tablesync.Rows[*Binding, string]{
	Key:    func(b *Binding) string { return b.Addr.String() },
	Query:  BindingAddrIndex.Query,
	Same:   (*Binding).sameDesired,
	Insert: func(b *Binding) *Binding { return b.SetStatus(reconciler.StatusPending()) },
}

// bindingOps reconciles policy-bindings into enimasq_policy_pods, and
// forgets the tracked connections of an address that goes or moves to
// another device: a new pod on a recycled IP starts with none.
type bindingOps struct {
	log   *slog.Logger
	progs *programs
	// swept is set once the first prune has forgotten the connections of
	// every address not bound to their device (an earlier run's).
	swept atomic.Bool
}

// Update binds the address to its device. A binding that moves (the pod's
// device made again, the IP given to another pod) forgets the connections
// tracked on the other device.
func (o *bindingOps) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, b *Binding) error {
	pods, err := o.progs.pods()
	if err != nil {
		return fmt.Errorf("policy programs: %w", err)
	}
	key := bpf.PolicyPodKey(b.Addr)
	var old uint32
	moved := pods.Lookup(key, &old) == nil && int(old) != b.Ifindex
	if err := pods.Put(key, uint32(b.Ifindex)); err != nil {
		return fmt.Errorf("bind %s to %s (ifindex %d): %w", b.Addr, b.Device, b.Ifindex, err)
	}
	if moved {
		// Its own connections on the old device, and the other pods'
		// connections with it as their peer: the address is another pod's
		// now, which must not inherit them.
		return o.forget(func(c bpf.PolicyConnection) bool {
			return c.Pod == b.Addr && int(c.Ifindex) != b.Ifindex || c.Peer == b.Addr
		},
			fmt.Sprintf("%s moved from ifindex %d to %s", b.Addr, old, b.Device))
	}
	return nil
}

// Delete unbinds the address (its route went: the pod, or its device) and
// forgets its connections.
func (o *bindingOps) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, b *Binding) error {
	pods, err := o.progs.pods()
	if err != nil {
		return fmt.Errorf("policy programs: %w", err)
	}
	// The connections go first: a retry after a failure finds the
	// binding still there to undo.
	if err := o.forget(func(c bpf.PolicyConnection) bool { return c.Pod == b.Addr || c.Peer == b.Addr },
		fmt.Sprintf("%s no longer routed to a pod's device", b.Addr)); err != nil {
		return err
	}
	if err := pods.Delete(bpf.PolicyPodKey(b.Addr)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("unbind %s from %s: %w", b.Addr, b.Device, err)
	}
	return nil
}

// Prune deletes the bindings that no row holds (an earlier run's) and
// forgets their connections; the first prune also forgets every connection
// whose pod is not bound to the device it was tracked on.
func (o *bindingOps) Prune(_ context.Context, _ statedb.ReadTxn, objects iter.Seq2[*Binding, statedb.Revision]) error {
	pods, err := o.progs.pods()
	if err != nil {
		return fmt.Errorf("policy programs: %w", err)
	}
	bound := map[netip.Addr]int{}
	for b := range objects {
		bound[b.Addr] = b.Ifindex
	}
	var stale [][]byte
	gone := map[netip.Addr]bool{}
	key := make([]byte, pods.KeySize())
	var cursor any
	for range pods.MaxEntries() + 1 {
		if err := pods.NextKey(cursor, key); err != nil {
			break
		}
		if addr, ok := bpf.PolicyPodOfKey(key); !ok || bound[addr] == 0 {
			stale = append(stale, slices.Clone(key))
			gone[addr] = true
		}
		cursor = slices.Clone(key)
	}
	var errs []error
	for _, k := range stale {
		if err := pods.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete a stale binding: %w", err))
		}
	}
	if !o.swept.Load() {
		err := o.forget(func(c bpf.PolicyConnection) bool { return bound[c.Pod] != int(c.Ifindex) }, "not bound to their device at start")
		if err == nil {
			o.swept.Store(true)
		}
		errs = append(errs, err)
	} else if len(gone) > 0 {
		errs = append(errs, o.forget(func(c bpf.PolicyConnection) bool { return gone[c.Pod] || gone[c.Peer] }, "stale bindings pruned"))
	}
	return errors.Join(errs...)
}

// forget deletes the tracked connections that match.
func (o *bindingOps) forget(match func(bpf.PolicyConnection) bool, why string) error {
	ct, err := o.progs.ct()
	if err != nil {
		return fmt.Errorf("policy programs: %w", err)
	}
	n, err := bpf.ForgetPolicyConnections(ct, match)
	if n > 0 {
		o.log.Debug("Forgot tracked connections", "connections", n, "why", why)
	}
	if err != nil {
		return fmt.Errorf("forget the tracked connections (%s): %w", why, err)
	}
	return nil
}

// ct is the connection-tracking map, once the state is open.
func (p *programs) ct() (*ebpf.Map, error) { return p.stateMap(bpf.PolicyCTMapName) }

// forgetDevice forgets the connections tracked on a device that no longer
// carries the programs, but for those of a pod still bound to it.
func (o *ops) forgetDevice(a *Attachment) error {
	pods, err := o.progs.pods()
	if err != nil {
		return fmt.Errorf("policy programs: %w", err)
	}
	b := &bindingOps{log: o.log, progs: o.progs}
	return b.forget(func(c bpf.PolicyConnection) bool {
		if int(c.Ifindex) != a.Ifindex {
			return false
		}
		var ifindex uint32
		return pods.Lookup(bpf.PolicyPodKey(c.Pod), &ifindex) != nil || int(ifindex) != a.Ifindex
	}, fmt.Sprintf("%s (ifindex %d) no longer carries the programs", a.Device, a.Ifindex))
}
