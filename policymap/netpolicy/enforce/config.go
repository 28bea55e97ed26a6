package enforce

import (
	"context"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// Attach modes (--network-policy-attach).
const (
	AttachAuto = "auto" // tcx where the kernel has it, else tc
	AttachTCX  = "tcx"
	AttachTC   = "tc"
)

// Settings are what the enforcement takes (the flags are netpolicy's).
type Settings struct {
	// Off, when set, says why nothing is attached; with RemoveWhenOff,
	// what an earlier run attached is taken off at start.
	Off           string
	RemoveWhenOff bool
	// Mode is the enforcing mode: strict attaches to every pod device and
	// denies a pod no policy selects.
	Mode policybpf.PolicyMode
	// Attach is AttachAuto, AttachTCX or AttachTC.
	Attach string
	// GlobalsDir is where the policy maps and the programs' state maps are
	// pinned; LinksDir where the tcx links are.
	GlobalsDir, LinksDir string
	// CheckInterval is how often the attachments are checked against the
	// kernel (a program detached by hand sends no notification).
	CheckInterval time.Duration
	// ConntrackMax is the size of the connection-tracking map (0: the
	// program's).
	ConntrackMax uint32
	// Events: the programs report denied packets in the events ring
	// buffer (--policy-event-logs).
	Events bool
	// Audit: a packet the policy denies passes, counted and reported as
	// audited (--policy-audit-mode).
	Audit bool
}

// modeText says the mode as health and status say it: "strict mode",
// "standard mode, audit: denied packets pass".
func (s Settings) modeText() string {
	t := s.Mode.String() + " mode"
	if s.Audit {
		t += ", audit: denied packets pass"
	}
	return t
}

// SelectedPods returns the pod IPs the policies select, whether the
// policies are all read yet (until they are, nothing is attached or
// pruned: a restart keeps enforcing), and a channel closed when either
// changes.
type SelectedPods func(txn statedb.ReadTxn) (pods []netip.Addr, initialized bool, changed <-chan struct{})

// PolicyMaps returns the kernel policy maps by name (policybpf.PolicyMapNames),
// once they are open.
type PolicyMaps func(ctx context.Context) (map[string]*ebpf.Map, error)

// ObjectNames names the object that decided a verdict (from the policy
// tables: a ClusterPolicyEndpoint by its id, the PolicyEndpoints of a
// NetworkPolicy decision); "" for none.
type ObjectNames func(d policybpf.Direction, q VerdictQuery, res policybpf.PolicyResult) string
