package allocations

import (
	"net/netip"
	"strings"

	"github.com/enimasq/enimasq/ipam/ipamapi"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// TableName is the name of the ipam-allocations table.
const TableName = "ipam-allocations"

// AllocationState says where an allocation stands.
type AllocationState string

const (
	// StateAllocated: the IP is in the pool of a usable ENI; its rules are
	// desired.
	StateAllocated AllocationState = "Allocated"
	// StateRestored: read from the checkpoint, the CiliumNode not read yet.
	StateRestored AllocationState = "Restored"
	// StateOrphaned: the IP has left the pool; its rules are removed. The
	// allocation stays until it is released (or its IP returns).
	StateOrphaned AllocationState = "Orphaned"
)

// Allocation is a pod IP handed out to an owner (namespace/pod), held by
// one attachment: the CNI's container ID and interface name. Two sandboxes
// of one pod (a StatefulSet pod recreated before the old sandbox's DEL) are
// two attachments with an IP each; a DEL releases only its own. An
// allocation made through the API without a container ID (Attachment is
// zero) belongs to its owner, as before attachments existed.
type Allocation struct {
	IP    netip.Addr
	Owner string
	// PodUID is the pod's UID, when the runtime passed K8S_POD_UID.
	PodUID     string     `json:",omitempty"`
	Attachment Attachment `json:",omitzero"`
	// V1 marks an allocation restored from a version-1 checkpoint (made by
	// the CNI before attachments were recorded): the DEL of its owner's pod
	// releases it. An allocation of the API (no attachment, not V1) is
	// released only through the API.
	V1 bool `json:",omitempty"`
	// ENI is the ENI whose pool holds the IP ("" when none does).
	ENI    string
	State  AllocationState
	Reason string `json:",omitempty"`
}

// Attachment is the CNI spec's attachment key (ipamapi): the network name,
// the container ID and the interface name in the container.
type Attachment = ipamapi.Attachment

// Family is "ipv4" or "ipv6".
func (a *Allocation) Family() string { return ipamapi.FamilyOf(a.IP) }

func (a *Allocation) TableHeader() []string {
	return []string{"IP", "Owner", "Attachment", "ENI", "State", "Reason"}
}

func (a *Allocation) TableRow() []string {
	eni := a.ENI
	if eni == "" {
		eni = "-"
	}
	return []string{a.IP.String(), a.Owner, a.Attachment.String(), eni, string(a.State), a.Reason}
}

var (
	// AllocationIPIndex is the primary index of ipam-allocations.
	AllocationIPIndex = statedb.Index[*Allocation, netip.Addr]{
		Name: "ip",
		FromObject: func(a *Allocation) index.KeySet {
			return index.NewKeySet(index.NetIPAddr(a.IP))
		},
		FromKey:    index.NetIPAddr,
		FromString: index.NetIPAddrString,
		Unique:     true,
	}
	// AllocationOwnerIndex finds the allocations of an owner.
	AllocationOwnerIndex = statedb.Index[*Allocation, string]{
		Name: "owner",
		FromObject: func(a *Allocation) index.KeySet {
			return index.NewKeySet(index.String(a.Owner))
		},
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     false,
	}
	// AllocationAttachmentIndex finds the allocations of an attachment
	// (one per family). As a string query: "[network:]containerID/ifname".
	AllocationAttachmentIndex = statedb.Index[*Allocation, Attachment]{
		Name: "attachment",
		FromObject: func(a *Allocation) index.KeySet {
			return index.NewKeySet(attachmentKey(a.Attachment))
		},
		FromKey: attachmentKey,
		FromString: func(s string) (index.Key, error) {
			var att Attachment
			if network, rest, ok := strings.Cut(s, ":"); ok {
				att.Network, s = network, rest
			}
			att.ContainerID, att.IfName, _ = strings.Cut(s, "/")
			return attachmentKey(att), nil
		},
		Unique: false,
	}
)

// attachmentKey is the attachment's (network, containerID, ifname): the
// same container and interface in another network is another attachment.
func attachmentKey(a Attachment) index.Key {
	return index.String(a.Network + "\x00" + a.ContainerID + "\x00" + a.IfName)
}

// NewAllocationTable creates and registers the ipam-allocations table.
func NewAllocationTable(db *statedb.DB) (statedb.RWTable[*Allocation], error) {
	return statedb.NewTable(db, TableName, AllocationIPIndex, AllocationOwnerIndex, AllocationAttachmentIndex)
}
