// Package ipamapi is the wire format of the ENI IPAM's HTTP API (the agent
// socket's /v1/ipam): the requests and answers the agent (package ipam),
// the CNI plugin and enimasq-dbg exchange. It imports nothing of the
// agent, so that the plugin, a short-lived binary the runtime starts for
// every pod, stays small, and both sides read one definition. The client
// and the error body every endpoint shares are cells/agentapi's.
package ipamapi

import "github.com/enimasq/enimasq/cells/agentapi"

// Attachment is the CNI spec's attachment key: the network name, the
// container ID and the interface name in the container. Network is empty
// for an attachment recorded before networks were (checkpoint version 2).
type Attachment struct {
	Network     string `json:"network,omitempty"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

// IsZero says whether there is no attachment (an allocation of the API).
func (a Attachment) IsZero() bool { return a == Attachment{} }

// String is "[network:]containerID/ifname" with the container ID cut to 12
// characters, as container runtimes show it; "-" when there is none.
func (a Attachment) String() string {
	if a.IsZero() {
		return "-"
	}
	id := a.ContainerID
	if len(id) > 12 {
		id = id[:12]
	}
	if a.Network != "" {
		return a.Network + ":" + id + "/" + a.IfName
	}
	return id + "/" + a.IfName
}

// Request asks for an IP for an owner (NAMESPACE/POD), the body of
// POST /v1/ipam. With a container ID (and an interface name) it is the
// CNI's attachment's: asking again for the same attachment and family
// returns the same IP, and another attachment of the same pod gets its own.
// Family is "ipv4" (default) or "ipv6"; IP asks for a given address.
type Request struct {
	Owner       string `json:"owner"`
	PodUID      string `json:"podUID,omitempty"`
	Network     string `json:"network,omitempty"`
	ContainerID string `json:"containerID,omitempty"`
	IfName      string `json:"ifname,omitempty"`
	Family      string `json:"family,omitempty"`
	IP          string `json:"ip,omitempty"`
}

// Attachment is the request's attachment (zero without a container ID).
func (r Request) Attachment() Attachment {
	if r.ContainerID == "" && r.IfName == "" {
		return Attachment{} // an API allocation: a network name alone is no attachment
	}
	return Attachment{Network: r.Network, ContainerID: r.ContainerID, IfName: r.IfName}
}

// AllocationResult is what an allocation returns, with the JSON field names
// of Cilium's IPAMAddressResponse.
type AllocationResult struct {
	IP              string   `json:"ip"`
	Gateway         string   `json:"gateway"`
	CIDRs           []string `json:"cidrs"`
	MasterMAC       string   `json:"master-mac"`
	InterfaceNumber string   `json:"interface-number"`
}

// AllocationInfo is one allocation as GET /v1/ipam lists it, and as a
// release or a GC answers what it freed.
type AllocationInfo struct {
	IP          string `json:"ip"`
	Owner       string `json:"owner"`
	PodUID      string `json:"podUID,omitempty"`
	Network     string `json:"network,omitempty"`
	ContainerID string `json:"containerID,omitempty"`
	IfName      string `json:"ifname,omitempty"`
	Family      string `json:"family"`
	// V1: restored from a version-1 checkpoint, made by the CNI before
	// attachments were recorded (its pod's DEL releases it).
	V1     bool   `json:"v1,omitempty"`
	ENI    string `json:"eni,omitempty"`
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// Attachment is the allocation's attachment (zero for the API's own).
func (i AllocationInfo) Attachment() Attachment {
	return Attachment{Network: i.Network, ContainerID: i.ContainerID, IfName: i.IfName}
}

// GCRequest lists the attachments the runtime still has (the CNI's GC),
// the body of POST /v1/ipam/gc.
// A GC is of one network: it releases that network's attachments only.
type GCRequest struct {
	Network          string       `json:"network"`
	ValidAttachments []Attachment `json:"validAttachments"`
}

// Error is the JSON body of an error answer of the IPAM API: the agent
// API's, and the result of an allocation that stands.
type Error struct {
	agentapi.Error
	// Result is set when the IP is allocated but waiting for its rules
	// failed: the allocation stands.
	Result *AllocationResult `json:"result,omitempty"`
}
