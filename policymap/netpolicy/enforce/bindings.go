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
	"strings"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/tablesync"
)

// BindingsTableName is the name of the table of the pods' source bindings.
const BindingsTableName = "policy-bindings"

// Binding is a pod address bound to the device the node routes it to (a
// host route of the main table to a veth), whatever the pod's policy and
// whether or not its device carries the programs: the programs drop a
// packet that claims a local pod's address and did not come from its
// device (bpf/policybpf/c/policy.c spoofed()). It is the entry of the address in
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
func (o *bindingOps) Update(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, b *Binding) error {
	batch := []reconciler.BatchEntry[*Binding]{{Object: b, Revision: rev}}
	o.UpdateBatch(ctx, txn, batch)
	return batch[0].Result
}

// UpdateBatch binds the addresses of a reconcile round, and forgets the
// connections of those that moved in one walk of the connections.
func (o *bindingOps) UpdateBatch(_ context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[*Binding]) {
	pods, err := o.progs.pods()
	if err != nil {
		setResults(batch, fmt.Errorf("policy programs: %w", err))
		return
	}
	// moved: the address's new ifindex, for those that moved.
	moved := map[netip.Addr]int{}
	var whys []string
	var movedEntries []*reconciler.BatchEntry[*Binding]
	for i := range batch {
		b := batch[i].Object
		key := policybpf.PolicyPodKey(b.Addr)
		var old uint32
		isMoved := pods.Lookup(key, &old) == nil && int(old) != b.Ifindex
		if err := pods.Put(key, uint32(b.Ifindex)); err != nil {
			batch[i].Result = fmt.Errorf("bind %s to %s (ifindex %d): %w", b.Addr, b.Device, b.Ifindex, err)
			continue
		}
		batch[i].Result = nil
		if isMoved {
			moved[b.Addr] = b.Ifindex
			movedEntries = append(movedEntries, &batch[i])
			whys = append(whys, fmt.Sprintf("%s moved from ifindex %d to %s", b.Addr, old, b.Device))
		}
	}
	if len(moved) == 0 {
		return
	}
	// Their own connections on the old device, and the other pods'
	// connections with them as their peer: an address is another pod's
	// now, which must not inherit them.
	err = o.forget(func(c policybpf.PolicyConnection) bool {
		if ifindex, ok := moved[c.Pod]; ok && int(c.Ifindex) != ifindex {
			return true
		}
		_, peer := moved[c.Peer]
		return peer
	}, whys...)
	for _, e := range movedEntries {
		e.Result = err
	}
}

// Delete unbinds the address (its route went: the pod, or its device) and
// forgets its connections.
func (o *bindingOps) Delete(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, b *Binding) error {
	batch := []reconciler.BatchEntry[*Binding]{{Object: b, Revision: rev}}
	o.DeleteBatch(ctx, txn, batch)
	return batch[0].Result
}

// DeleteBatch unbinds the addresses of a reconcile round, their
// connections forgotten first in one walk.
func (o *bindingOps) DeleteBatch(_ context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[*Binding]) {
	pods, err := o.progs.pods()
	if err != nil {
		setResults(batch, fmt.Errorf("policy programs: %w", err))
		return
	}
	gone := map[netip.Addr]bool{}
	whys := make([]string, 0, len(batch))
	for _, e := range batch {
		gone[e.Object.Addr] = true
		whys = append(whys, fmt.Sprintf("%s no longer routed to a pod's device", e.Object.Addr))
	}
	// The connections go first: a retry after a failure finds the
	// bindings still there to undo.
	if err := o.forget(func(c policybpf.PolicyConnection) bool { return gone[c.Pod] || gone[c.Peer] }, whys...); err != nil {
		setResults(batch, err)
		return
	}
	for i := range batch {
		b := batch[i].Object
		batch[i].Result = nil
		if err := pods.Delete(policybpf.PolicyPodKey(b.Addr)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			batch[i].Result = fmt.Errorf("unbind %s from %s: %w", b.Addr, b.Device, err)
		}
	}
}

// setResults sets the result of every entry of a batch.
func setResults[Obj any](batch []reconciler.BatchEntry[Obj], err error) {
	for i := range batch {
		batch[i].Result = err
	}
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
		if addr, ok := policybpf.PolicyPodOfKey(key); !ok || bound[addr] == 0 {
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
		err := o.forget(func(c policybpf.PolicyConnection) bool { return bound[c.Pod] != int(c.Ifindex) }, "not bound to their device at start")
		if err == nil {
			o.swept.Store(true)
		}
		errs = append(errs, err)
	} else if len(gone) > 0 {
		errs = append(errs, o.forget(func(c policybpf.PolicyConnection) bool { return gone[c.Pod] || gone[c.Peer] }, "stale bindings pruned"))
	}
	return errors.Join(errs...)
}

// forget deletes the tracked connections that match, in one walk of the
// connections whatever the number of pods or devices match names (whys:
// one reason each, for the log and the error).
func (o *bindingOps) forget(match func(policybpf.PolicyConnection) bool, whys ...string) error {
	return forgetConnections(o.log, o.progs, match, whys...)
}

// forgetConnections is one walk of the connection-tracking map that
// forgets what match names.
func forgetConnections(log *slog.Logger, progs *programs, match func(policybpf.PolicyConnection) bool, whys ...string) error {
	ct, err := progs.ct()
	if err != nil {
		return fmt.Errorf("policy programs: %w", err)
	}
	n, err := forgetPolicyConnections(ct, match)
	why := strings.Join(whys, ", ")
	if len(whys) > 3 {
		why = fmt.Sprintf("%s and %d more", strings.Join(whys[:3], ", "), len(whys)-3)
	}
	if n > 0 {
		log.Debug("Forgot tracked connections", "connections", n, "why", why)
	}
	if err != nil {
		return fmt.Errorf("forget the tracked connections (%s): %w", why, err)
	}
	return nil
}

// forgetPolicyConnections is policybpf.ForgetPolicyConnections; tests count the
// walks.
var forgetPolicyConnections = policybpf.ForgetPolicyConnections

// ct is the connection-tracking map, once the state is open.
func (p *programs) ct() (*ebpf.Map, error) { return p.stateMap(policybpf.PolicyCTMapName) }

// forgetDevices forgets the connections tracked on devices that no longer
// carry the programs (by ifindex), but for those of a pod still bound to
// the device, in one walk.
func (o *ops) forgetDevices(devices map[int]bool, whys ...string) error {
	pods, err := o.progs.pods()
	if err != nil {
		return fmt.Errorf("policy programs: %w", err)
	}
	return forgetConnections(o.log, o.progs, func(c policybpf.PolicyConnection) bool {
		if !devices[int(c.Ifindex)] {
			return false
		}
		var ifindex uint32
		return pods.Lookup(policybpf.PolicyPodKey(c.Pod), &ifindex) != nil || ifindex != c.Ifindex
	}, whys...)
}
