package allocator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"github.com/enimasq/enimasq/cells/agentapi"
	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/ipamapi"
)

// APIPatterns are the agent API patterns (net/http ServeMux) the API is
// mounted on. The API routes by method itself:
//
//	POST   /v1/ipam[?wait=true]   allocate (body: Request)   201 / 200 + AllocationResult
//	GET    /v1/ipam               list                       200 + []AllocationInfo
//	GET    /v1/ipam/{ip}          the result of an allocation 200 + AllocationResult
//	DELETE /v1/ipam/{ip}          release                    200 + AllocationInfo
//
// Errors are an APIError with 400 (invalid request), 404 (IP not in the
// pool, unknown IP), 409 (IP held by another owner, owner holds another
// IP), 503 (pool exhausted, not ready, rules failed while waiting) or 500.
var APIPatterns = []string{"/v1/ipam", "/v1/ipam/"}

// WaitTimeout bounds POST /v1/ipam?wait=true; ?timeout=DURATION (up to
// MaxWaitTimeout) sets another bound, as the CNI plugin's waitSeconds does.
const (
	WaitTimeout    = 30 * time.Second
	MaxWaitTimeout = 5 * time.Minute
)

func infoOf(a *allocations.Allocation) AllocationInfo {
	return AllocationInfo{
		IP: a.IP.String(), Owner: a.Owner, PodUID: a.PodUID,
		Network: a.Attachment.Network, ContainerID: a.Attachment.ContainerID, IfName: a.Attachment.IfName, Family: a.Family(), V1: a.V1, ENI: a.ENI,
		State: string(a.State), Reason: a.Reason,
	}
}

// API serves the ENI IPAM endpoints of the agent API.
type API struct {
	alloc *Allocator
	log   *slog.Logger
	mux   *http.ServeMux
}

// NewAPI returns the API of an allocator.
func NewAPI(alloc *Allocator, log *slog.Logger) *API {
	a := &API{alloc: alloc, log: log, mux: http.NewServeMux()}
	a.mux.HandleFunc("POST /v1/ipam", a.allocate)
	a.mux.HandleFunc("GET /v1/ipam", a.list)
	a.mux.HandleFunc("GET /v1/ipam/status", a.status)
	a.mux.HandleFunc("GET /v1/ipam/{ip}", a.get)
	a.mux.HandleFunc("DELETE /v1/ipam/{ip}", a.release)
	a.mux.HandleFunc("POST /v1/ipam/release", a.releaseAttachment)
	a.mux.HandleFunc("POST /v1/ipam/gc", a.gc)
	return a
}

// The wire types, defined in ipamapi for the plugin and enimasq-dbg.
type (
	APIError       = ipamapi.Error
	AllocationInfo = ipamapi.AllocationInfo
	GCRequest      = ipamapi.GCRequest
)

func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// errorStatus maps an allocator error to a status code and a reason.
func errorStatus(err error) (int, string) {
	switch {
	case errors.Is(err, ErrInvalidRequest):
		return http.StatusBadRequest, "invalid-request"
	case errors.Is(err, ErrNotInPool):
		return http.StatusNotFound, "not-in-pool"
	case errors.Is(err, ErrUnknownIP):
		return http.StatusNotFound, "unknown-ip"
	case errors.Is(err, ErrIPInUse):
		return http.StatusConflict, "ip-in-use"
	case errors.Is(err, ErrOwnerHasIP):
		return http.StatusConflict, "owner-has-ip"
	case errors.Is(err, ErrPoolExhausted):
		return http.StatusServiceUnavailable, "pool-exhausted"
	case errors.Is(err, ErrNotReady):
		return http.StatusServiceUnavailable, "not-ready"
	case errors.Is(err, ErrRulesFailed):
		return http.StatusServiceUnavailable, "rules-failed"
	default:
		return http.StatusInternalServerError, "internal"
	}
}

// writeError answers the status and reason of an allocator error, with
// the result of an allocation that stands.
func writeError(w http.ResponseWriter, err error, result *AllocationResult) {
	code, reason := errorStatus(err)
	agentapi.WriteJSONIndent(w, code, APIError{Error: agentapi.Error{Message: err.Error(), Reason: reason}, Result: result})
}

func (a *API) allocate(w http.ResponseWriter, r *http.Request) {
	wait, err := agentapi.QueryBool(r, "wait", false)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	timeout, err := agentapi.QueryDuration(r, "timeout", WaitTimeout, MaxWaitTimeout)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	var req Request
	if err := agentapi.DecodeBody(r, maxBody, &req, `{"owner": "NAMESPACE/POD", "containerID": "...", "ifname": "eth0", "family": "ipv4", "ip": "..."}`); err != nil {
		writeError(w, err, nil)
		return
	}
	result, created, err := a.alloc.Allocate(req)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	if wait {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		ip := netip.MustParseAddr(result.IP)
		if err := a.alloc.WaitProgrammed(ctx, ip); err != nil {
			if created && !req.Attachment().IsZero() {
				// A CNI ADD that fails leaves nothing behind: the allocation it
				// made goes, and its rules with it. (An API client's stays, with
				// the result, to be waited for again or released.)
				if _, rerr := a.alloc.Release(ip); rerr != nil {
					err = errors.Join(err, fmt.Errorf("releasing %s again: %w", ip, rerr))
				} else {
					err = fmt.Errorf("%w; %s is released again", err, ip)
				}
				a.log.Warn("The pod's rules are not programmed: allocation undone", "ip", ip, "owner", req.Owner,
					"attachment", req.Attachment(), "error", err)
				writeError(w, err, nil)
				return
			}
			a.log.Warn("Allocated, but the pod's rules are not programmed", "ip", ip, "owner", req.Owner, "error", err)
			writeError(w, err, &result)
			return
		}
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	agentapi.WriteJSONIndent(w, code, result)
}

// maxBody bounds a request body.
const maxBody = 1 << 20

// list answers every allocation, or with ?containerID=&ifname= those of
// one container's interface (in every network, or in ?network=, which
// includes the attachments recorded without a network).
func (a *API) list(w http.ResponseWriter, r *http.Request) {
	if err := a.alloc.Restored(); err != nil {
		writeError(w, err, nil)
		return
	}
	q := r.URL.Query()
	att := allocations.Attachment{Network: q.Get("network"), ContainerID: q.Get("containerID"), IfName: q.Get("ifname")}
	if err := validateAttachment(att); err != nil {
		writeError(w, fmt.Errorf("%w: %w", ErrInvalidRequest, err), nil)
		return
	}
	out := []AllocationInfo{}
	for _, al := range a.alloc.Allocations() {
		if att.IsZero() || (al.Attachment.ContainerID == att.ContainerID && al.Attachment.IfName == att.IfName &&
			(att.Network == "" || al.Attachment.Network == att.Network || al.Attachment.Network == "")) {
			out = append(out, infoOf(al))
		}
	}
	agentapi.WriteJSONIndent(w, http.StatusOK, out)
}

// writeReleased answers the allocations a release or GC freed.
func writeReleased(w http.ResponseWriter, released []*allocations.Allocation, err error) {
	if err != nil {
		writeError(w, err, nil)
		return
	}
	out := make([]AllocationInfo, 0, len(released))
	for _, al := range released {
		out = append(out, infoOf(al))
	}
	agentapi.WriteJSONIndent(w, http.StatusOK, out)
}

// releaseAttachment frees the IPs of one attachment (the CNI's DEL); an
// unknown attachment frees nothing and is no error.
func (a *API) releaseAttachment(w http.ResponseWriter, r *http.Request) {
	var att allocations.Attachment
	if err := agentapi.DecodeBody(r, maxBody, &att, `{"network": "...", "containerID": "...", "ifname": "eth0"}`); err != nil {
		writeError(w, err, nil)
		return
	}
	released, err := a.alloc.ReleaseAttachment(att)
	writeReleased(w, released, err)
}

// gc frees the IPs of every attachment not in the request.
func (a *API) gc(w http.ResponseWriter, r *http.Request) {
	var req GCRequest
	if err := agentapi.DecodeBody(r, maxBody, &req, `{"network": "...", "validAttachments": [{"containerID": "...", "ifname": "eth0"}]}`); err != nil {
		writeError(w, err, nil)
		return
	}
	released, err := a.alloc.GC(req.Network, req.ValidAttachments)
	writeReleased(w, released, err)
}

// status answers whether an allocation (a CNI ADD) of ?family= (default
// ipv4) would get an IP now: 200 {"free": N}, or the error an ADD would get
// (503 not-ready, 503 pool-exhausted). The CNI's STATUS asks it.
func (a *API) status(w http.ResponseWriter, r *http.Request) {
	family := cmp.Or(r.URL.Query().Get("family"), ipamapi.FamilyIPv4)
	if family != ipamapi.FamilyIPv4 && family != ipamapi.FamilyIPv6 {
		writeError(w, fmt.Errorf("%w: family=%q: want ipv4 or ipv6", ErrInvalidRequest, family), nil)
		return
	}
	free, err := a.alloc.CanAllocate(family)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	agentapi.WriteJSONIndent(w, http.StatusOK, map[string]int{"free": free})
}

func (a *API) get(w http.ResponseWriter, r *http.Request) {
	ip, err := agentapi.PathAddr(r, "ip")
	if err != nil {
		writeError(w, err, nil)
		return
	}
	result, err := a.alloc.Result(ip)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	agentapi.WriteJSONIndent(w, http.StatusOK, result)
}

func (a *API) release(w http.ResponseWriter, r *http.Request) {
	ip, err := agentapi.PathAddr(r, "ip")
	if err != nil {
		writeError(w, err, nil)
		return
	}
	held, err := a.alloc.Release(ip)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	agentapi.WriteJSONIndent(w, http.StatusOK, infoOf(held))
}
