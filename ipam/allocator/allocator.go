package allocator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/enimasq/enimasq/cells/agentapi"
	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/ciliumnode"
	"github.com/enimasq/enimasq/ipam/ipamapi"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/ipmasq"
)

// Errors of the allocator. Each API answer maps one of them to a status
// code; they are wrapped with the details.
var (
	// ErrInvalidRequest: malformed owner, family or IP, or a body or query
	// parameter the API cannot read (400): the agent API's.
	ErrInvalidRequest = agentapi.ErrInvalidRequest
	// ErrNotInPool: the requested IP is not handed out by this node (404).
	ErrNotInPool = errors.New("IP not in the pool")
	// ErrUnknownIP: no allocation holds the IP (404).
	ErrUnknownIP = errors.New("unknown IP")
	// ErrIPInUse: the requested IP is held by another owner (409).
	ErrIPInUse = errors.New("IP held by another owner")
	// ErrOwnerHasIP: the owner holds another IP of the family (409).
	ErrOwnerHasIP = errors.New("owner holds another IP")
	// ErrPoolExhausted: every IP of the family is allocated (503).
	ErrPoolExhausted = errors.New("pool exhausted")
	// ErrNotReady: the CiliumNode or the checkpoint is not read yet (503).
	ErrNotReady = errors.New("not ready")
	// ErrRulesFailed: waiting for the pod's rules and routes ended with an
	// error (503); the allocation stands.
	ErrRulesFailed = errors.New("rules not programmed")
)

// Request asks for an IP (ipamapi).
type Request = ipamapi.Request

// Allocator hands out pod IPs from the pool of the CiliumNode and is the
// only writer of ipam-allocations (with the pool-sync job, which only
// updates the ENI and state columns). Every change is checkpointed before
// it is committed and answered. Safe for concurrent use.
type Allocator struct {
	mu sync.Mutex // serializes allocate, release and restore with the checkpoint

	log            *slog.Logger
	db             *statedb.DB
	allocs         statedb.RWTable[*allocations.Allocation]
	enis           statedb.Table[*ciliumnode.ENI]
	cidrs          statedb.Table[*ipmasq.CIDR]
	programmed     Programmed
	settings       Settings
	checkpoint     string
	ciliumNodePath string
	retry          time.Duration
	restoreDone    func(statedb.WriteTxn)
	metrics        *ipamMetrics
	// checkpointHealth is Degraded from a failed checkpoint write until one
	// succeeds (nil in tests that build an Allocator by hand).
	checkpointHealth cell.Health
}

// parseRequest checks a request and returns the owner, the family and the
// requested IP (invalid when none).
func (a *Allocator) parseRequest(req Request) (owner, family string, want netip.Addr, err error) {
	owner = req.Owner
	if err := validateOwner(owner); err != nil {
		return "", "", netip.Addr{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if err := validateAttachment(req.Attachment()); err != nil {
		return "", "", netip.Addr{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if req.PodUID != "" {
		if err := validatePodUID(req.PodUID); err != nil {
			return "", "", netip.Addr{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
	}
	if req.IP != "" {
		want, err = netip.ParseAddr(req.IP)
		if err != nil || want.Zone() != "" {
			return "", "", netip.Addr{}, fmt.Errorf("%w: ip %q is not an IP address", ErrInvalidRequest, req.IP)
		}
		want = want.Unmap()
	}
	family = req.Family
	switch family {
	case "":
		family = ipamapi.FamilyIPv4
		if want.IsValid() {
			family = ipamapi.FamilyOf(want)
		}
	case ipamapi.FamilyIPv4, ipamapi.FamilyIPv6:
	default:
		return "", "", netip.Addr{}, fmt.Errorf("%w: family %q: want %q or %q", ErrInvalidRequest, req.Family, ipamapi.FamilyIPv4, ipamapi.FamilyIPv6)
	}
	if want.IsValid() && ipamapi.FamilyOf(want) != family {
		return "", "", netip.Addr{}, fmt.Errorf("%w: ip %s is not %s", ErrInvalidRequest, want, family)
	}
	switch {
	case family == ipamapi.FamilyIPv4 && !a.settings.EnableIPv4:
		return "", "", netip.Addr{}, fmt.Errorf("%w: IPv4 is disabled on this node (--enable-ipv4=false)", ErrInvalidRequest)
	case family == ipamapi.FamilyIPv6 && !a.settings.EnableIPv6:
		return "", "", netip.Addr{}, fmt.Errorf("%w: IPv6 is disabled on this node (--enable-ipv6=false)", ErrInvalidRequest)
	}
	return owner, family, want, nil
}

// ready says why allocation cannot run yet, if it cannot.
func (a *Allocator) ready(txn statedb.ReadTxn, needENIs bool) error {
	if ok, _ := a.allocs.Initialized(txn); !ok {
		return fmt.Errorf("%w: allocations are not restored from the checkpoint %s yet", ErrNotReady, a.checkpoint)
	}
	if !needENIs {
		return nil
	}
	if ok, _ := a.enis.Initialized(txn); !ok {
		return fmt.Errorf("%w: no CiliumNode read yet from %s", ErrNotReady, a.ciliumNodePath)
	}
	if ok, _ := a.cidrs.Initialized(txn); !ok {
		return fmt.Errorf("%w: the ip-masq-agent CIDRs are not loaded yet (is the ip-masq-agent config valid?)", ErrNotReady)
	}
	return nil
}

func (a *Allocator) pool(txn statedb.ReadTxn) ciliumnode.Pool {
	return ciliumnode.NewPool(statedb.Collect(a.enis.All(txn)))
}

func (a *Allocator) nonMasq(txn statedb.ReadTxn) []netip.Prefix {
	var out []netip.Prefix
	for c := range a.cidrs.All(txn) {
		out = append(out, c.Prefix)
	}
	return out
}

// Allocate hands out an IP to the request's attachment: the requested one,
// or the next free one of the family. Asking again for the same attachment
// and family returns the same allocation (created is false). Without a
// container ID the owner is the attachment, as for the API's own
// allocations.
func (a *Allocator) Allocate(req Request) (result AllocationResult, created bool, err error) {
	defer func() {
		if err != nil {
			a.metrics.allocationFailed(err)
		}
	}()
	owner, family, want, err := a.parseRequest(req)
	if err != nil {
		return AllocationResult{}, false, err
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	wtxn := a.db.WriteTxn(a.allocs)
	defer wtxn.Abort()
	if err := a.ready(wtxn, true); err != nil {
		return AllocationResult{}, false, err
	}
	pool := a.pool(wtxn)
	nonMasq := a.nonMasq(wtxn)

	att := req.Attachment()
	if held := a.heldBy(wtxn, att, owner, family); held != nil {
		if want.IsValid() && want != held.IP {
			return AllocationResult{}, false, fmt.Errorf("%w: %s holds %s, not %s (release it first)", ErrOwnerHasIP, owner, held.IP, want)
		}
		eni, ok := pool.ENI(held.IP)
		if !ok {
			return AllocationResult{}, false, fmt.Errorf("%w: %s holds %s, which has left the pool (%s): release it first",
				ErrOwnerHasIP, owner, held.IP, pool.WhyNotInPool(held.IP))
		}
		if held.Attachment != att {
			// Recorded before networks were: it is this network's now.
			migrated := *held
			migrated.Attachment = att
			a.allocs.Insert(wtxn, &migrated)
			if err := a.writeCheckpoint(wtxn); err != nil {
				return AllocationResult{}, false, err
			}
			wtxn.Commit()
		}
		return NewResult(held.IP, eni, a.settings.NativeRouting, nonMasq), false, nil
	}

	taken := func(ip netip.Addr) bool {
		_, _, found := a.allocs.Get(wtxn, allocations.AllocationIPIndex.Query(ip))
		return found
	}
	ip := want
	if ip.IsValid() {
		if _, ok := pool.ENI(ip); !ok {
			return AllocationResult{}, false, fmt.Errorf("%w: %s", ErrNotInPool, pool.WhyNotInPool(ip))
		}
		if held, _, found := a.allocs.Get(wtxn, allocations.AllocationIPIndex.Query(ip)); found {
			return AllocationResult{}, false, fmt.Errorf("%w: %s is held by %s", ErrIPInUse, ip, held.Owner)
		}
	} else {
		var ok bool
		if ip, ok = pool.Next(family, taken); !ok {
			return AllocationResult{}, false, fmt.Errorf("%w: no free %s address (the pool has %d addresses of all families)",
				ErrPoolExhausted, family, pool.Len())
		}
	}
	eni, _ := pool.ENI(ip)
	a.allocs.Insert(wtxn, &allocations.Allocation{IP: ip, Owner: owner, PodUID: req.PodUID, Attachment: att, ENI: eni.ID, State: allocations.StateAllocated})
	if err := a.writeCheckpoint(wtxn); err != nil {
		return AllocationResult{}, false, err
	}
	wtxn.Commit()
	a.log.Info("Allocated pod IP", "ip", ip, "owner", owner, "attachment", att, "eni", eni.ID, "table", eni.RouteTable())
	return NewResult(ip, eni, a.settings.NativeRouting, nonMasq), true, nil
}

// heldBy is the allocation of family that att already holds (without an
// attachment: that owner holds), or nil.
func (a *Allocator) heldBy(txn statedb.ReadTxn, att allocations.Attachment, owner, family string) *allocations.Allocation {
	for _, key := range attachmentKeys(att) {
		for al := range a.allocs.List(txn, allocations.AllocationAttachmentIndex.Query(key)) {
			if ipamapi.FamilyOf(al.IP) == family && (!att.IsZero() || al.Owner == owner) {
				return al
			}
		}
	}
	return nil
}

// attachmentKeys are the keys under which att's allocations are recorded:
// att, and for an attachment of a network the same container and interface
// recorded without one (checkpoint version 2).
func attachmentKeys(att allocations.Attachment) []allocations.Attachment {
	if att.Network == "" {
		return []allocations.Attachment{att}
	}
	return []allocations.Attachment{att, {ContainerID: att.ContainerID, IfName: att.IfName}}
}

// Release returns the IP to the pool; the pod's rules are removed.
func (a *Allocator) Release(ip netip.Addr) (*allocations.Allocation, error) {
	ip = ip.Unmap()
	released, err := a.releaseAll(func(txn statedb.ReadTxn) []*allocations.Allocation {
		held, _, found := a.allocs.Get(txn, allocations.AllocationIPIndex.Query(ip))
		if !found {
			return nil
		}
		return []*allocations.Allocation{held}
	})
	if err != nil {
		return nil, err
	}
	if len(released) == 0 {
		return nil, fmt.Errorf("%w: %s is not allocated", ErrUnknownIP, ip)
	}
	return released[0], nil
}

// ReleaseAttachment releases the IPs of one attachment (the CNI's DEL),
// and only those: another sandbox of the same pod, and another interface of
// the same container, keep theirs. An attachment the allocator does not
// hold is released already: nothing is touched and that is no error. An
// attachment recorded without a network (checkpoint version 2) is the
// attachment of the same container and interface in any network.
func (a *Allocator) ReleaseAttachment(att allocations.Attachment) ([]*allocations.Allocation, error) {
	if att.IsZero() {
		return nil, fmt.Errorf("%w: no containerID", ErrInvalidRequest)
	}
	if err := validateAttachment(att); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return a.releaseAll(func(txn statedb.ReadTxn) []*allocations.Allocation {
		var out []*allocations.Allocation
		for _, k := range attachmentKeys(att) {
			out = append(out, statedb.Collect(a.allocs.List(txn, allocations.AllocationAttachmentIndex.Query(k)))...)
		}
		return out
	})
}

// GC releases the allocation of every attachment of network that is not in
// valid (the CNI's GC, with the runtime's cni.dev/valid-attachments): the
// attachments of other networks are theirs to collect. Allocations without
// an attachment were made through the API, not by the CNI: they stay. A
// GC without a network is of the attachments recorded without one.
func (a *Allocator) GC(network string, valid []allocations.Attachment) ([]*allocations.Allocation, error) {
	if err := validateNetwork(network); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	keep := make(map[allocations.Attachment]bool, len(valid))
	for _, att := range valid {
		if att.Network == "" {
			att.Network = network
		}
		if err := validateAttachment(att); err != nil || att.IsZero() {
			return nil, fmt.Errorf("%w: valid attachment %+v: %w", ErrInvalidRequest, att, cmp.Or(err, errors.New("no containerID")))
		}
		if att.Network != network {
			return nil, fmt.Errorf("%w: valid attachment %s is not of network %q", ErrInvalidRequest, att, network)
		}
		keep[att] = true
	}
	return a.releaseAll(func(txn statedb.ReadTxn) []*allocations.Allocation {
		var stale []*allocations.Allocation
		for al := range a.allocs.All(txn) {
			if !al.Attachment.IsZero() && al.Attachment.Network == network && !keep[al.Attachment] {
				stale = append(stale, al)
			}
		}
		return stale
	})
}

// releaseAll deletes the allocations pick returns, checkpoints and commits
// once, and returns them (none: nothing is written).
func (a *Allocator) releaseAll(pick func(statedb.ReadTxn) []*allocations.Allocation) ([]*allocations.Allocation, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	wtxn := a.db.WriteTxn(a.allocs)
	defer wtxn.Abort()
	if err := a.ready(wtxn, false); err != nil {
		return nil, err
	}
	released := pick(wtxn)
	if len(released) == 0 {
		return nil, nil
	}
	for _, al := range released {
		a.allocs.Delete(wtxn, al)
	}
	if err := a.writeCheckpoint(wtxn); err != nil {
		return nil, err
	}
	wtxn.Commit()
	for _, al := range released {
		a.log.Info("Released pod IP", "ip", al.IP, "owner", al.Owner, "attachment", al.Attachment)
	}
	return released, nil
}

// Restored says whether the checkpoint is restored: nil once it is, an
// error wrapping ErrNotReady before. Listing before then would answer "no
// allocation" for every running pod.
func (a *Allocator) Restored() error { return a.ready(a.db.ReadTxn(), false) }

// CanAllocate says whether an ADD of family would get an IP now, and how
// many are free: an error wrapping ErrNotReady (the checkpoint, the
// CiliumNode or the ip-masq-agent CIDRs not loaded: an ADD is refused the
// same) or ErrPoolExhausted, else nil. A config error whose last good state
// is in force is no reason: allocation goes on with it.
func (a *Allocator) CanAllocate(family string) (free int, err error) {
	txn := a.db.ReadTxn()
	if err := a.ready(txn, true); err != nil {
		return 0, err
	}
	pool := a.pool(txn)
	for _, ip := range pool.IPs() {
		if ipamapi.FamilyOf(ip) != family {
			continue
		}
		if _, _, taken := a.allocs.Get(txn, allocations.AllocationIPIndex.Query(ip)); !taken {
			free++
		}
	}
	if free == 0 {
		return 0, fmt.Errorf("%w: no free %s address (the pool has %d addresses of all families)", ErrPoolExhausted, family, pool.Len())
	}
	return free, nil
}

// Allocations returns every allocation, by IP.
func (a *Allocator) Allocations() []*allocations.Allocation {
	return statedb.Collect(a.allocs.All(a.db.ReadTxn()))
}

// Result returns the allocation result of an allocated IP, computed from
// the current ENIs and non-masquerade CIDRs.
func (a *Allocator) Result(ip netip.Addr) (AllocationResult, error) {
	txn := a.db.ReadTxn()
	if err := a.ready(txn, false); err != nil {
		return AllocationResult{}, err
	}
	al, _, found := a.allocs.Get(txn, allocations.AllocationIPIndex.Query(ip))
	if !found {
		return AllocationResult{}, fmt.Errorf("%w: %s is not allocated", ErrUnknownIP, ip)
	}
	eni, ok := a.pool(txn).ENI(al.IP)
	if !ok {
		return AllocationResult{}, fmt.Errorf("%w: %s", ErrNotInPool, a.pool(txn).WhyNotInPool(al.IP))
	}
	return NewResult(al.IP, eni, a.settings.NativeRouting, a.nonMasq(txn)), nil
}

// WaitProgrammed waits until the rules of the pod with IP ip and the routes
// of its ENI are in the kernel (Programmed). An error is ErrRulesFailed,
// or ErrUnknownIP when ip was released meanwhile, or ErrNotInPool when its
// rules cannot be (the IP is not in a usable ENI's pool).
func (a *Allocator) WaitProgrammed(ctx context.Context, ip netip.Addr) error {
	err := a.programmed.Wait(ctx, ip)
	if err == nil {
		return nil
	}
	txn := a.db.ReadTxn()
	al, _, found := a.allocs.Get(txn, allocations.AllocationIPIndex.Query(ip))
	if !found {
		return fmt.Errorf("%w: %s was released while waiting for its rules", ErrUnknownIP, ip)
	}
	if _, ok := a.pool(txn).ENI(al.IP); !ok {
		return fmt.Errorf("%w: %s", ErrNotInPool, a.pool(txn).WhyNotInPool(al.IP))
	}
	return fmt.Errorf("%w: %w", ErrRulesFailed, err)
}

// placement is where an allocation stands against the pool.
func placement(p ciliumnode.Pool, a *allocations.Allocation) (eni string, state allocations.AllocationState, reason string) {
	if e, ok := p.ENI(a.IP); ok {
		return e.ID, allocations.StateAllocated, ""
	}
	return "", allocations.StateOrphaned, p.WhyNotInPool(a.IP) + ": its rules are removed; release it"
}
