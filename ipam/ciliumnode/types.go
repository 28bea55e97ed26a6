package ciliumnode

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The cilium.io/v2 CiliumNode as Cilium v1.20.2 defines it
// (pkg/k8s/apis/cilium.io/v2, pkg/aws/types, pkg/ipam/types), decoded
// strictly: a field that is not here is an error naming its path, as the
// API server's strict field validation would make it. The subtrees enimasq
// does not read are known fields of any content (json.RawMessage); the
// fields older Cilium releases wrote under spec.eni are accepted and
// ignored, so that a CiliumNode kept from an upgrade still reads.

type ciliumNodeObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ciliumNodeSpec   `json:"spec"`
	Status            ciliumNodeStatus `json:"status"`
}

type ciliumNodeSpec struct {
	InstanceID   string          `json:"instance-id"`
	BootID       string          `json:"bootid"`
	Addresses    json.RawMessage `json:"addresses"`
	Health       json.RawMessage `json:"health"`
	Ingress      json.RawMessage `json:"ingress"`
	Encryption   json.RawMessage `json:"encryption"`
	ENI          eniSpec         `json:"eni"`
	Azure        json.RawMessage `json:"azure"`
	AlibabaCloud json.RawMessage `json:"alibaba-cloud"`
	IPAM         ipamSpec        `json:"ipam"`
}

type eniSpec struct {
	FirstInterfaceIndex *int `json:"first-interface-index"`

	InstanceType            string          `json:"instance-type"`
	SecurityGroups          json.RawMessage `json:"security-groups"`
	SecurityGroupTags       json.RawMessage `json:"security-group-tags"`
	SubnetIDs               json.RawMessage `json:"subnet-ids"`
	SubnetTags              json.RawMessage `json:"subnet-tags"`
	NodeSubnetID            string          `json:"node-subnet-id"`
	VpcID                   string          `json:"vpc-id"`
	AvailabilityZone        string          `json:"availability-zone"`
	ExcludeInterfaceTags    json.RawMessage `json:"exclude-interface-tags"`
	DeleteOnTermination     *bool           `json:"delete-on-termination"`
	UsePrimaryAddress       *bool           `json:"use-primary-address"`
	DisablePrefixDelegation *bool           `json:"disable-prefix-delegation"`

	// Written under spec.eni by Cilium releases before the fields moved.
	InstanceID        string          `json:"instance-id"`
	MinAllocate       json.RawMessage `json:"min-allocate"`
	PreAllocate       json.RawMessage `json:"pre-allocate"`
	MaxAboveWatermark json.RawMessage `json:"max-above-watermark"`
}

type ipamSpec struct {
	Pool map[string]allocationIP `json:"pool"`

	IPv6Pool          json.RawMessage `json:"ipv6-pool"`
	Pools             json.RawMessage `json:"pools"`
	PodCIDRs          json.RawMessage `json:"podCIDRs"`
	MinAllocate       json.RawMessage `json:"min-allocate"`
	MaxAllocate       json.RawMessage `json:"max-allocate"`
	PreAllocate       json.RawMessage `json:"pre-allocate"`
	MaxAboveWatermark json.RawMessage `json:"max-above-watermark"`
	StaticIPTags      json.RawMessage `json:"static-ip-tags"`
}

type allocationIP struct {
	Owner    string `json:"owner"`
	Resource string `json:"resource"`
}

type ciliumNodeStatus struct {
	ENI struct {
		ENIs map[string]eniStatus `json:"enis"`
	} `json:"eni"`
	IPAM struct {
		// Used is what Cilium's CRD allocator (before v1.20) and enimasq's
		// own allocator report; Cilium v1.20's ENI multi-pool IPAM clears
		// it. Not read: enimasq's pod set is its own allocations, or
		// Cilium's endpoints in the Cilium build.
		Used             json.RawMessage `json:"used"`
		IPv6Used         json.RawMessage `json:"ipv6-used"`
		PodCIDRs         json.RawMessage `json:"pod-cidrs"`
		OperatorStatus   json.RawMessage `json:"operator-status"`
		ReleaseIPs       json.RawMessage `json:"release-ips"`
		ReleaseIPv6s     json.RawMessage `json:"release-ipv6s"`
		AssignedStaticIP string          `json:"assigned-static-ip"`
	} `json:"ipam"`
	Azure        json.RawMessage `json:"azure"`
	AlibabaCloud json.RawMessage `json:"alibaba-cloud"`
}

type eniStatus struct {
	ID     string `json:"id"`
	IP     string `json:"ip"`
	MAC    string `json:"mac"`
	Number *int   `json:"number"`
	Subnet struct {
		ID   string `json:"id"`
		CIDR string `json:"cidr"`
	} `json:"subnet"`
	VPC struct {
		ID          string   `json:"id"`
		PrimaryCIDR string   `json:"primary-cidr"`
		CIDRs       []string `json:"cidrs"`
	} `json:"vpc"`

	AvailabilityZone string          `json:"availability-zone"`
	Description      string          `json:"description"`
	Addresses        []string        `json:"addresses"`
	Prefixes         []string        `json:"prefixes"`
	IPv6Prefixes     []string        `json:"ipv6-prefixes"`
	SecurityGroups   json.RawMessage `json:"security-groups"`
	Tags             json.RawMessage `json:"tags"`
	PublicIP         string          `json:"public-ip"`
}
