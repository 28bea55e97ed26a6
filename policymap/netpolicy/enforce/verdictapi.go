package enforce

import (
	"fmt"
	"net/http"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/agentapi"
)

// VerdictPath is where the verdict API is served (under APIPatterns):
//
//	POST /v1/policy/verdict {"queries": [VerdictQuery...]}
//
// runs the policy verdict program (the program on the pods' devices, bound
// to the policy maps as they are and to the node's mode) with
// BPF_PROG_TEST_RUN on a packet made from each query and answers
// VerdictAnswer, one result per query in order. The program is loaded once
// and again only when a policy map is replaced, so a call costs the test
// runs, not a load through the verifier. It runs with empty scratch maps of
// tracked connections and fragments: a verdict is the policy's for a new
// connection, and a query leaves nothing in the kernel. Errors are {"error",
// "reason"} with 400 (invalid request) or 503 (no kernel policy maps, or the
// program cannot be loaded).
const VerdictPath = "/v1/policy/verdict"

// MaxVerdictQueries bounds the queries of one call; maxVerdictBody its
// body.
const (
	MaxVerdictQueries = 100000
	maxVerdictBody    = 64 << 20
)

// VerdictQuery is a packet to judge, seen from the pod.
type VerdictQuery struct {
	// Direction is "egress" (the pod sends) or "ingress" (it receives).
	Direction string     `json:"direction"`
	Pod       netip.Addr `json:"pod"`
	Peer      netip.Addr `json:"peer"`
	// Protocol is the IP protocol number; Port the destination port
	// (TCP, UDP and SCTP).
	Protocol uint32 `json:"protocol"`
	Port     uint16 `json:"port,omitempty"`
}

// VerdictResult is the program's verdict on one query.
type VerdictResult struct {
	// Allow: the packet passes; with Audited, only because the agent runs
	// in audit mode (--policy-audit-mode): the policy denies it.
	Allow   bool                   `json:"allow"`
	Audited bool                   `json:"audited,omitempty"`
	Reason  policybpf.PolicyReason `json:"reason"`
	// Step is the deciding step: admin, namespace, baseline or default.
	Step string `json:"step"`
	// Object names the deciding object ("ClusterPolicyEndpoint/name",
	// "PolicyEndpoint/namespace/name"; several, comma-separated, for a
	// NetworkPolicy denial: the objects that isolate the pod), "" when
	// none decided.
	Object string `json:"object,omitempty"`
	// Interval is the index of the deciding interval in the deciding
	// map's value, or -1.
	Interval int `json:"interval"`
}

// VerdictRequest and VerdictAnswer are the body and answer of a call.
type (
	VerdictRequest struct {
		Queries []VerdictQuery `json:"queries"`
	}
	VerdictAnswer struct {
		Mode    string          `json:"mode"`
		Results []VerdictResult `json:"results"`
	}
)

// Verdicts serves VerdictPath: the verdict program, kept loaded.
type Verdicts struct {
	settings Settings
	maps     PolicyMaps
	names    ObjectNames

	mu     sync.Mutex
	loaded boundPrograms
	mode   *ebpf.Map
}

type verdictsParams struct {
	cell.In

	Lifecycle cell.Lifecycle
	Settings  Settings
	Maps      PolicyMaps
	Names     ObjectNames `optional:"true"`
}

func newVerdicts(p verdictsParams) *Verdicts {
	lc, s := p.Lifecycle, p.Settings
	v := &Verdicts{settings: s, maps: p.Maps, names: p.Names}
	lc.Append(cell.Hook{OnStop: func(cell.HookContext) error { v.close(); return nil }})
	return v
}

func (v *Verdicts) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.loaded.close()
	if v.mode != nil {
		v.mode.Close()
		v.mode = nil
	}
}

// program returns the verdict program for the current policy maps, loaded
// again only when one was replaced. v.mu is held.
func (v *Verdicts) program(r *http.Request) (*policybpf.PolicyProgram, error) {
	maps, err := v.maps(r.Context())
	if err != nil {
		return nil, err
	}
	return v.loaded.bind(maps, func() (map[string]*ebpf.Map, error) {
		if v.mode == nil {
			_, spec, err := policybpf.PolicyStateSpecs()
			if err != nil {
				return nil, err
			}
			spec.Pinning = ebpf.PinNone
			mode, err := ebpf.NewMap(spec)
			if err != nil {
				return nil, fmt.Errorf("mode map: %w", err)
			}
			// The node's mode, audit included (a verdict says AUDIT as
			// the programs on the devices judge); events off.
			m := v.settings.Mode
			if v.settings.Audit {
				m |= policybpf.PolicyModeAudit
			}
			if err := policybpf.SetPolicyMode(mode, m); err != nil {
				mode.Close()
				return nil, err
			}
			v.mode = mode
		}
		return map[string]*ebpf.Map{policybpf.PolicyModeMapName: v.mode}, nil
	})
}

func (v *Verdicts) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req VerdictRequest
	if err := agentapi.DecodeBody(r, maxVerdictBody, &req, `{"queries": [{"direction": "egress", "pod": "IP", "peer": "IP", "protocol": 6, "port": 80}]}`); err != nil {
		writeError(w, err)
		return
	}
	if len(req.Queries) > MaxVerdictQueries {
		writeError(w, fmt.Errorf("%w: %d queries, at most %d a call", errInvalid, len(req.Queries), MaxVerdictQueries))
		return
	}
	frames := make([][]byte, len(req.Queries))
	dirs := make([]policybpf.Direction, len(req.Queries))
	for i, q := range req.Queries {
		var err error
		if dirs[i], err = policybpf.ParseDirection(q.Direction); err != nil {
			writeError(w, fmt.Errorf("%w: query %d: %w", errInvalid, i, err))
			return
		}
		src, dst := q.Pod, q.Peer
		if dirs[i] == policybpf.Ingress {
			src, dst = q.Peer, q.Pod
		}
		if q.Protocol > 255 {
			writeError(w, fmt.Errorf("%w: query %d: protocol %d", errInvalid, i, q.Protocol))
			return
		}
		if frames[i], err = policybpf.PolicyTestFrame(src.Unmap(), dst.Unmap(), uint8(q.Protocol), 40000, q.Port); err != nil {
			writeError(w, fmt.Errorf("%w: query %d: %w", errInvalid, i, err))
			return
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	prog, err := v.program(r)
	if err != nil {
		agentapi.WriteError(w, http.StatusServiceUnavailable, "no-program", err)
		return
	}
	answer := VerdictAnswer{Mode: v.settings.Mode.String(), Results: make([]VerdictResult, len(frames))}
	for i, frame := range frames {
		res, err := prog.Run(dirs[i], frame)
		if err != nil {
			agentapi.WriteError(w, http.StatusServiceUnavailable, "run", fmt.Errorf("query %d: %w", i, err))
			return
		}
		answer.Results[i] = VerdictResult{Allow: res.Allow, Audited: res.Audited, Reason: res.Reason, Step: res.Step.String(), Interval: res.Interval}
		if v.names != nil {
			answer.Results[i].Object = v.names(dirs[i], req.Queries[i], res)
		}
	}
	agentapi.WriteJSON(w, http.StatusOK, answer)
}
