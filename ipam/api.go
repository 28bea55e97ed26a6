package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"time"
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

// APIError is the body of every error answer.
type APIError struct {
	Message string `json:"error"`
	// Reason is a stable, machine-readable name of the error.
	Reason string `json:"reason"`
	// Result is set when the IP is allocated but waiting for its rules
	// failed: the allocation stands.
	Result *AllocationResult `json:"result,omitempty"`
}

// AllocationInfo is one allocation as GET /v1/ipam lists it.
type AllocationInfo struct {
	IP     string `json:"ip"`
	Owner  string `json:"owner"`
	Family string `json:"family"`
	ENI    string `json:"eni,omitempty"`
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

func infoOf(a *Allocation) AllocationInfo {
	return AllocationInfo{
		IP: a.IP.String(), Owner: a.Owner, Family: a.Family(), ENI: a.ENI,
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
	a.mux.HandleFunc("GET /v1/ipam/{ip}", a.get)
	a.mux.HandleFunc("DELETE /v1/ipam/{ip}", a.release)
	return a
}

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

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, err error, result *AllocationResult) {
	code, reason := errorStatus(err)
	writeJSON(w, code, APIError{Message: err.Error(), Reason: reason, Result: result})
}

func (a *API) allocate(w http.ResponseWriter, r *http.Request) {
	wait, timeout := false, WaitTimeout
	if s := r.URL.Query().Get("wait"); s != "" {
		var err error
		if wait, err = strconv.ParseBool(s); err != nil {
			writeError(w, fmt.Errorf("%w: wait=%q: want true or false", ErrInvalidRequest, s), nil)
			return
		}
	}
	if s := r.URL.Query().Get("timeout"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 || d > MaxWaitTimeout {
			writeError(w, fmt.Errorf("%w: timeout=%q: want a duration up to %s", ErrInvalidRequest, s, MaxWaitTimeout), nil)
			return
		}
		timeout = d
	}
	var req Request
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, fmt.Errorf("%w: body: want {\"owner\": \"NAMESPACE/POD\", \"family\": \"ipv4\", \"ip\": \"...\"}: %w",
			ErrInvalidRequest, err), nil)
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
			a.log.Warn("Allocated, but the pod's rules are not programmed", "ip", ip, "owner", req.Owner, "error", err)
			writeError(w, err, &result)
			return
		}
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	writeJSON(w, code, result)
}

func (a *API) list(w http.ResponseWriter, r *http.Request) {
	out := []AllocationInfo{}
	for _, al := range a.alloc.Allocations() {
		out = append(out, infoOf(al))
	}
	writeJSON(w, http.StatusOK, out)
}

func pathIP(r *http.Request) (netip.Addr, error) {
	s := r.PathValue("ip")
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%w: %q is not an IP address", ErrInvalidRequest, s)
	}
	return ip.Unmap(), nil
}

func (a *API) get(w http.ResponseWriter, r *http.Request) {
	ip, err := pathIP(r)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	result, err := a.alloc.Result(ip)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	writeJSON(w, http.StatusOK, result)
}

func (a *API) release(w http.ResponseWriter, r *http.Request) {
	ip, err := pathIP(r)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	held, err := a.alloc.Release(ip)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	writeJSON(w, http.StatusOK, infoOf(held))
}
