package ciliumlink

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/cilium/cilium/pkg/endpoint"
	"github.com/cilium/cilium/pkg/endpointmanager"
	"github.com/cilium/cilium/pkg/endpointstate"
	"github.com/cilium/cilium/pkg/node"
	"github.com/cilium/cilium/pkg/option"
	"github.com/cilium/cilium/pkg/promise"

	"github.com/enimasq/enimasq/ipam/podset"
)

// The pod set of the Cilium build: the IPs whose ENI egress rules enimasq
// keeps are the ones Cilium configured rules for (RoutingInfo.Configure):
// its endpoints (pods, as cilium-cni creates them and the agent restores
// them, and the health endpoint) and the local node's router IP
// (cilium_host) and ingress IP. They are read from Cilium itself, the
// endpoint manager's subscription and the local-node table: Cilium v1.20's
// ENI IPAM records no pod in the CiliumNode. ipam places each IP on the ENI
// that holds it and derives its rules.

// Owners of the IPs that are not a pod's.
const (
	OwnerRouter   = "cilium-router"
	OwnerHealth   = "cilium-health"
	OwnerIngress  = "cilium-ingress"
	OwnerEndpoint = "cilium-endpoint"
)

// endpointSet is a Subscriber of Cilium's endpoint manager: it keeps the
// endpoints that exist. Its callbacks run under the manager's lock: they
// only record and signal.
type endpointSet struct {
	mu        sync.Mutex
	endpoints map[*endpoint.Endpoint]struct{}
	changed   chan struct{}
}

var _ endpointmanager.Subscriber = (*endpointSet)(nil)

func newEndpointSet() *endpointSet {
	return &endpointSet{endpoints: map[*endpoint.Endpoint]struct{}{}, changed: make(chan struct{}, 1)}
}

func (s *endpointSet) EndpointCreated(ep *endpoint.Endpoint)  { s.add(ep) }
func (s *endpointSet) EndpointRestored(ep *endpoint.Endpoint) { s.add(ep) }

// EndpointDeleted comes after Cilium has deleted the endpoint's routing
// rules (the ingress rule first): ipam deletes the egress rules left.
func (s *endpointSet) EndpointDeleted(ep *endpoint.Endpoint, _ endpoint.DeleteConfig) {
	s.mu.Lock()
	delete(s.endpoints, ep)
	s.mu.Unlock()
	s.signal()
}

func (s *endpointSet) add(ep *endpoint.Endpoint) {
	s.mu.Lock()
	s.endpoints[ep] = struct{}{}
	s.mu.Unlock()
	s.signal()
}

func (s *endpointSet) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// endpointIP is an IP of an endpoint; a pod's owner is its namespace/name.
type endpointIP struct {
	ip  netip.Addr
	pod string // "" for an endpoint that is not a pod's
}

// ips are the endpoints' IPs. Only fields that are constant after an
// endpoint's creation are read, without its lock.
func (s *endpointSet) ips() []endpointIP {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []endpointIP
	for ep := range s.endpoints {
		pod := ""
		if ep.K8sNamespace != "" && ep.GetK8sPodName() != "" {
			pod = ep.GetK8sNamespaceAndPodName()
		}
		for _, ip := range []netip.Addr{ep.IPv4Address(), ep.IPv6Address()} {
			if ip.IsValid() {
				out = append(out, endpointIP{ip: ip.Unmap(), pod: pod})
			}
		}
	}
	return out
}

type podSetParams struct {
	cell.In

	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Group
	External  *podset.Writer `optional:"true"`
	Endpoints endpointmanager.EndpointManager
	Restorer  promise.Promise[endpointstate.Restorer]
	LocalNode statedb.Table[*node.LocalNode]
	DB        *statedb.DB
	Daemon    *option.DaemonConfig
}

// registerPodSet subscribes to Cilium's endpoints before any is restored
// (hive construction) and keeps ipam-allocations equal to the pod set.
// Nothing when enimasq's ENI cells are off (IPAM mode not ENI).
func registerPodSet(p podSetParams) {
	if p.External == nil {
		return
	}
	set := newEndpointSet()
	p.Endpoints.Subscribe(set)
	p.Lifecycle.Append(cell.Hook{OnStop: func(cell.HookContext) error { p.Endpoints.Unsubscribe(set); return nil }})
	ps := &podSet{podSetParams: p, endpoints: set}
	p.Jobs.Add(job.OneShot("follow-cilium-endpoints", ps.run))
}

type podSet struct {
	podSetParams
	endpoints *endpointSet
}

func (ps *podSet) run(ctx context.Context, health cell.Health) error {
	// Cilium's restore re-adds each restored endpoint's rules with the
	// CIDRs of this start, then exposes the endpoint: the set is complete,
	// and ipam may prune, only once it is done.
	restored := make(chan struct{})
	go func() {
		restorer, err := ps.Restorer.Await(ctx)
		if err == nil {
			err = restorer.WaitForEndpointRestoreWithoutRegeneration(ctx)
		}
		if err != nil {
			if ctx.Err() == nil {
				ps.Log.Warn("Waiting for Cilium's endpoint restore", "error", err)
			}
			return
		}
		close(restored)
	}()
	// The endpoints already known (none, as the subscription is made before
	// Cilium starts; an embedding that subscribes later would miss them).
	for _, ep := range ps.Endpoints.GetEndpoints() {
		ps.endpoints.add(ep)
	}

	isRestored := false
	for {
		if !isRestored {
			select {
			case <-restored:
				isRestored = true
			default:
			}
		}
		txn := ps.DB.ReadTxn()
		local, _, nodeWatch, _ := ps.LocalNode.GetWatch(txn, node.LocalNodeQuery)
		ips, routerKnown := ps.collect(local)
		complete := isRestored && routerKnown
		placed, enisWatch := ps.External.Sync(ips, complete)
		switch {
		case !isRestored:
			health.OK(fmt.Sprintf("waiting for Cilium's endpoint restore (%d IPs so far)", len(ips)))
		case !routerKnown:
			health.OK(fmt.Sprintf("waiting for Cilium's router IP (%d IPs so far)", len(ips)))
		default:
			health.OK(fmt.Sprintf("following Cilium's endpoints and router: %d IPs, %d on an ENI", len(ips), placed))
		}
		var restoredCh <-chan struct{}
		if !isRestored {
			restoredCh = restored
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ps.endpoints.changed:
		case <-nodeWatch:
		case <-enisWatch:
		case <-restoredCh:
		}
	}
}

// collect is the pod set: the endpoints' IPs and the local node's router
// and ingress IPs, by IP (an IP given twice, an endpoint and the node's,
// is listed once). routerKnown says whether the router IP of every family
// Cilium runs is.
func (ps *podSet) collect(local *node.LocalNode) (ips []podset.IP, routerKnown bool) {
	byIP := map[netip.Addr]string{}
	var health map[netip.Addr]bool
	routerKnown = local != nil
	if local != nil {
		health = map[netip.Addr]bool{}
		for _, ip := range []net.IP{local.IPv4HealthIP, local.IPv6HealthIP} {
			if a, ok := netip.AddrFromSlice(ip); ok {
				health[a.Unmap()] = true
			}
		}
		for _, family := range []struct {
			enabled bool
			router  net.IP
			ingress net.IP
		}{
			{ps.Daemon.EnableIPv4, local.GetCiliumInternalIP(false), local.IPv4IngressIP},
			{ps.Daemon.EnableIPv6, local.GetCiliumInternalIP(true), local.IPv6IngressIP},
		} {
			if !family.enabled {
				continue
			}
			router, ok := netip.AddrFromSlice(family.router)
			if !ok {
				routerKnown = false
				continue
			}
			byIP[router.Unmap()] = OwnerRouter
			if ingress, ok := netip.AddrFromSlice(family.ingress); ok {
				byIP[ingress.Unmap()] = OwnerIngress
			}
		}
	}
	for _, e := range ps.endpoints.ips() {
		owner := e.pod
		if owner == "" {
			owner = OwnerEndpoint
			if health[e.ip] {
				owner = OwnerHealth
			}
		}
		byIP[e.ip] = owner
	}
	for ip, owner := range byIP {
		ips = append(ips, podset.IP{IP: ip, Owner: owner})
	}
	slices.SortFunc(ips, func(a, b podset.IP) int { return a.IP.Compare(b.IP) })
	return ips, routerKnown
}
