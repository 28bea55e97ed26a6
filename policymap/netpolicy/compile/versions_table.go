package compile

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// PolicyVersionsTableName is the table of the versions of the pods'
// policies.
const PolicyVersionsTableName = "policy-versions"

// tiers are the tiers with a version of their own: the NetworkPolicy maps
// (policy-map-entries) and the cluster maps (cluster-policy-map-entries).
var tiers = [...]policybpf.PolicyTier{policybpf.TierNetworkPolicy, policybpf.TierCluster}

// TierVersions is where a pod's policy of one tier stands.
type TierVersions struct {
	// Active is the version in force: the one written to
	// enimasq_policy_versions (0: none; policybpf.PolicyVersionClosed: denied).
	Active uint32
	// Prev is the version in force before Active, until the row is Done
	// (the kernel may still use it): its entries stay until then.
	Prev uint32
	// Want is the newest version the deriver wrote (0: the pod has no
	// entries of the tier), and Rows its entries: it comes into force
	// once all of them are Done.
	Want uint32
	Rows int
	// Editing says that Active is being edited in place (edit.go): the
	// deriver changed some of its entries (Rows in all), and not all of
	// them are in the kernel yet. Every state on the way is within the
	// policy before and after the edit; the switch clears it once every
	// row of Active is Done.
	Editing bool `json:",omitempty"`
	// Waiting says that the pod's new version waits for room in the maps
	// (room.go): it did not fit beside other pods' new versions, and was
	// taken back so that an older one could be written whole; the deriver
	// writes it again once the switch lets it.
	Waiting bool `json:",omitempty"`
	// Failed is why Want cannot come into force (an entry the kernel
	// refuses), or why an edit of Active cannot be written whole, while
	// it cannot.
	Failed string
	// Names is the revision of policy-fqdn that Want was compiled from,
	// for a pod with name rules of the tier (names.go): once Active is
	// Want and the row Done, the kernel holds every address the pod was
	// told up to that revision.
	Names statedb.Revision `json:",omitempty"`
}

func (t TierVersions) text() string {
	s := versionText(t.Active)
	switch {
	case t.Want != t.Active:
		s += " (" + versionText(t.Want) + " pending)"
	case t.Editing:
		s += " (editing)"
	case t.Waiting:
		s += " (waiting for room)"
	}
	return s
}

func versionText(v uint32) string {
	switch v {
	case policybpf.PolicyVersionNone:
		return "none"
	case policybpf.PolicyVersionClosed:
		return "closed"
	}
	return strconv.FormatUint(uint64(v), 10)
}

// PodVersions is a pod IP's versions, per tier: the row of
// enimasq_policy_versions. The derivers write Want and Rows, the switch
// (switch.go) Active, Prev and Failed. Objects in the table are immutable.
type PodVersions struct {
	Pod    netip.Addr
	Tiers  [len(tiers)]TierVersions
	Status reconciler.Status
}

func (v *PodVersions) MapName() string { return policybpf.PolicyVersionsMapName }
func (v *PodVersions) MapKey() []byte  { return policybpf.PolicyPodKey(v.Pod) }
func (v *PodVersions) MapValue() []byte {
	return policybpf.EncodePolicyVersions(v.Tiers[0].Active, v.Tiers[1].Active)
}

func (v *PodVersions) Clone() *PodVersions { c := *v; return &c }

func (v *PodVersions) GetStatus() reconciler.Status { return v.Status }

func (v *PodVersions) SetStatus(s reconciler.Status) *PodVersions {
	v.Status = s
	return v
}

// settled says whether the pod needs nothing more: every tier's newest
// version in force, no older one left.
func (v *PodVersions) settled() bool {
	for _, t := range v.Tiers {
		if t.Want != t.Active || t.Prev != 0 || t.Editing || t.Waiting {
			return false
		}
	}
	return v.Status.Kind == reconciler.StatusKindDone
}

// empty says whether the pod has no version of any tier.
func (v *PodVersions) empty() bool {
	for _, t := range v.Tiers {
		if t.Want != 0 || t.Active != 0 || t.Prev != 0 {
			return false
		}
	}
	return true
}

func (v *PodVersions) TableHeader() []string {
	return []string{"Pod", "NetworkPolicy", "Cluster", "Status", "Error"}
}

func (v *PodVersions) TableRow() []string {
	errs := v.Status.GetError()
	for i, t := range v.Tiers {
		if t.Failed != "" {
			if errs != "" {
				errs += "; "
			}
			errs += fmt.Sprintf("%s version %s: %s", tierNames[i], versionText(t.Want), t.Failed)
		}
	}
	return []string{v.Pod.String(), v.Tiers[0].text(), v.Tiers[1].text(), v.Status.Kind.String(), errs}
}

var tierNames = [...]string{"NetworkPolicy", "cluster"}

type podVersionsView struct {
	Pod           netip.Addr        `json:"Pod" yaml:"pod"`
	NetworkPolicy TierVersions      `json:"NetworkPolicy" yaml:"networkPolicy"`
	Cluster       TierVersions      `json:"Cluster" yaml:"cluster"`
	Status        reconciler.Status `json:"Status" yaml:"status"`
}

func (v *PodVersions) MarshalJSON() ([]byte, error) {
	return json.Marshal(podVersionsView{v.Pod, v.Tiers[0], v.Tiers[1], v.Status})
}

func (v *PodVersions) MarshalYAML() (any, error) {
	return podVersionsView{v.Pod, v.Tiers[0], v.Tiers[1], v.Status}, nil
}

// PodVersionsIndex is the primary index: the pod IP.
var PodVersionsIndex = statedb.Index[*PodVersions, netip.Addr]{
	Name: "pod",
	FromObject: func(v *PodVersions) index.KeySet {
		return index.NewKeySet(index.NetIPAddr(v.Pod))
	},
	FromKey:    index.NetIPAddr,
	FromString: index.NetIPAddrString,
	Unique:     true,
}

// NewPolicyVersionsTable creates and registers policy-versions.
func NewPolicyVersionsTable(db *statedb.DB) (statedb.RWTable[*PodVersions], error) {
	return statedb.NewTable(db, PolicyVersionsTableName, PodVersionsIndex)
}

// WaitVersionsSettled waits until every pod's newest version of each tier
// is in force, none failing (for script commands and tests); an error
// naming the pods that are not after timeout.
func WaitVersionsSettled(db *statedb.DB, table statedb.Table[*PodVersions], timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		iter, watch := table.AllWatch(db.ReadTxn())
		var waiting []string
		for v := range iter {
			failed := false
			for _, t := range v.Tiers {
				failed = failed || t.Failed != ""
			}
			if !v.settled() && !failed {
				waiting = append(waiting, strings.Join(v.TableRow(), " "))
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		select {
		case <-watch:
		case <-deadline:
			return fmt.Errorf("policy versions not in force after %s: %s", timeout, strings.Join(waiting, "; "))
		}
	}
}
