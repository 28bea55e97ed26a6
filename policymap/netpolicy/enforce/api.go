package enforce

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/cells/agentapi"
	"github.com/enimasq/enimasq/cells/nldump"
)

// APIPatterns are the agent API patterns (net/http ServeMux) the API is
// mounted on:
//
//	GET /v1/policy/devices/{device}?ip=IP[&ip=IP...][&timeout=DURATION]
//
// answers once the pod device's programs are on it and its maps hold the
// pod addresses given (their policy-attachments and policy-bindings rows
// Done, for the device's current ifindex): 200 + DeviceAnswer, Enforced
// true. With network policy off, no device carries programs: it answers at
// once, Enforced false with the reason. Errors are {"error", "reason"} with 400
// (invalid request), 404 (no such device) or 503 (not enforced before the
// timeout, with the last row error).
var APIPatterns = []string{"/v1/policy/"}

// The bounds of a wait (?timeout=), as the IPAM API's.
const (
	WaitTimeout    = 30 * time.Second
	MaxWaitTimeout = 5 * time.Minute
)

// DeviceAnswer is the answer of GET /v1/policy/devices/{device}.
type DeviceAnswer struct {
	Device   string `json:"device"`
	Ifindex  int    `json:"ifindex,omitempty"`
	Enforced bool   `json:"enforced"`
	// Reason says why the programs are not on the device (Enforced false).
	Reason string `json:"reason,omitempty"`
}

// API serves the wait of a CNI ADD for the programs on its pod's device.
type API struct {
	db       *statedb.DB
	table    statedb.Table[*Attachment]
	bindings statedb.Table[*Binding]
	pods     SelectedPods
	settings Settings
	mux      *http.ServeMux
}

func newAPI(db *statedb.DB, table statedb.RWTable[*Attachment], bindings statedb.RWTable[*Binding], pods SelectedPods, s Settings, v *Verdicts, o *observers) *API {
	a := &API{db: db, table: table, bindings: bindings, pods: pods, settings: s, mux: http.NewServeMux()}
	a.mux.HandleFunc("GET /v1/policy/devices/{device}", a.device)
	a.mux.Handle("POST "+VerdictPath, v)
	a.mux.Handle("GET "+EventsPath, o.events)
	return a
}

func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

var (
	errInvalid  = agentapi.ErrInvalidRequest
	errNoDevice = errors.New("no such device")
)

// writeError answers an error of the API with its status and reason.
func writeError(w http.ResponseWriter, err error) {
	code, reason := http.StatusServiceUnavailable, "not-enforced"
	switch {
	case errors.Is(err, errInvalid):
		code, reason = http.StatusBadRequest, "invalid-request"
	case errors.Is(err, errNoDevice):
		code, reason = http.StatusNotFound, "no-device"
	}
	agentapi.WriteError(w, code, reason, err)
}

func (a *API) device(w http.ResponseWriter, r *http.Request) {
	device := r.PathValue("device")
	timeout, err := agentapi.QueryDuration(r, "timeout", WaitTimeout, MaxWaitTimeout)
	if err != nil {
		writeError(w, err)
		return
	}
	ips, err := agentapi.QueryAddrs(r, "ip")
	if err != nil {
		writeError(w, err)
		return
	}
	if device == "" || len(ips) == 0 {
		writeError(w, fmt.Errorf("%w: want a device and at least one ip", errInvalid))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	answer, err := a.Wait(ctx, device, ips)
	if err != nil {
		writeError(w, err)
		return
	}
	agentapi.WriteJSON(w, http.StatusOK, answer)
}

// Wait waits until the programs are on the device and the maps hold its
// pod addresses ips, or answers at once that no device carries any
// (network policy off). It follows the rows as they change; a row in Error is retried by
// its reconciler, and Wait returns the last such error when ctx ends.
func (a *API) Wait(ctx context.Context, device string, ips []netip.Addr) (DeviceAnswer, error) {
	answer := DeviceAnswer{Device: device}
	if a.settings.Off != "" {
		answer.Reason = a.settings.Off
		return answer, nil
	}
	var lastErr error
	for {
		txn := a.db.ReadTxn()
		_, initialized, podsWatch := a.pods(txn)
		var watches []<-chan struct{}
		if initialized {
			link, err := nldump.LinkByName(device)
			if err != nil {
				return answer, fmt.Errorf("%w: %s: %w", errNoDevice, device, err)
			}
			answer.Ifindex = link.Attrs().Index
			done, ws, err := a.enforced(txn, device, answer.Ifindex, ips)
			if done {
				answer.Enforced = true
				return answer, nil
			}
			if err != nil {
				lastErr = err
			}
			watches = ws
		}
		// A change of the device (made again) comes as a change of its
		// row; the retry tick covers a device that is not routed yet.
		if err := waitAny(ctx, append(watches, podsWatch)); err != nil {
			if lastErr != nil {
				return answer, fmt.Errorf("the programs are not on %s: %w", device, lastErr)
			}
			return answer, fmt.Errorf("the programs are not on %s (is a host route to the pod on it?): %w", device, err)
		}
	}
}

// enforced says whether the device's row and its pods' bindings are Done
// for ifindex; err is a row's error.
func (a *API) enforced(txn statedb.ReadTxn, device string, ifindex int, ips []netip.Addr) (bool, []<-chan struct{}, error) {
	row, _, watch, found := a.table.GetWatch(txn, DeviceIndex.Query(device))
	watches := []<-chan struct{}{watch}
	done := found && row.Ifindex == ifindex && rowDone(row.Status)
	var err error
	if found && row.Status.Kind == reconciler.StatusKindError {
		err = fmt.Errorf("policy-attachments %s: %s", device, row.Status.GetError())
	}
	for _, ip := range ips {
		done = done && slices.Contains(row.Pods, ip)
		b, _, watch, found := a.bindings.GetWatch(txn, BindingAddrIndex.Query(ip.String()))
		watches = append(watches, watch)
		done = done && found && b.Ifindex == ifindex && rowDone(b.Status)
		if found && b.Status.Kind == reconciler.StatusKindError {
			err = fmt.Errorf("policy-bindings %s: %s", ip, b.Status.GetError())
		}
	}
	return done, watches, err
}

func rowDone(s reconciler.Status) bool { return s.Kind == reconciler.StatusKindDone }

// waitAny waits until one of the channels closes, for at most a short
// tick (the device's route can come after the call), or ctx ends.
func waitAny(ctx context.Context, chans []<-chan struct{}) error {
	woken, stop := make(chan struct{}), make(chan struct{})
	defer close(stop)
	var once sync.Once
	for _, c := range chans {
		go func() {
			select {
			case <-c:
				once.Do(func() { close(woken) })
			case <-stop:
			}
		}()
	}
	tick := time.NewTimer(50 * time.Millisecond)
	defer tick.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-woken:
	case <-tick.C:
	}
	return nil
}
