package source

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The wire shape of networking.k8s.aws/v1alpha1 PolicyEndpoint objects, as
// the AWS network policy controller writes them, decoded strictly (see
// decodeObject): every field is listed, an unknown one is an error. An empty
// string is a missing value.

// policyEndpointObject is one PolicyEndpoint.
type policyEndpointObject struct {
	APIVersion string              `json:"apiVersion"`
	Kind       string              `json:"kind"`
	Metadata   objectMeta          `json:"metadata"`
	Spec       *policyEndpointSpec `json:"spec"`
	Status     json.RawMessage     `json:"status"` // ignored
}

// objectMeta is the wire shape of metav1.ObjectMeta: only name and
// namespace are used. (metav1.ObjectMeta itself decodes its timestamps with
// an UnmarshalJSON method, whose errors could not be located.)
type objectMeta struct {
	Name                       string            `json:"name"`
	Namespace                  string            `json:"namespace"`
	GenerateName               string            `json:"generateName"`
	UID                        string            `json:"uid"`
	ResourceVersion            string            `json:"resourceVersion"`
	Generation                 int64             `json:"generation"`
	CreationTimestamp          *string           `json:"creationTimestamp"`
	DeletionTimestamp          *string           `json:"deletionTimestamp"`
	DeletionGracePeriodSeconds *int64            `json:"deletionGracePeriodSeconds"`
	Labels                     map[string]string `json:"labels"`
	Annotations                map[string]string `json:"annotations"`
	OwnerReferences            []map[string]any  `json:"ownerReferences"`
	Finalizers                 []string          `json:"finalizers"`
	ManagedFields              []map[string]any  `json:"managedFields"`
	SelfLink                   string            `json:"selfLink"`
}

type policyEndpointSpec struct {
	PolicyRef    *policyReference `json:"policyRef"`
	PodIsolation []string         `json:"podIsolation"` // Ingress, Egress
	// PodSelector was resolved by the controller into PodSelectorEndpoints:
	// it is not used.
	PodSelector          *metav1.LabelSelector `json:"podSelector"`
	PodSelectorEndpoints []podEndpoint         `json:"podSelectorEndpoints"`
	Ingress              []endpointInfo        `json:"ingress"`
	Egress               []endpointInfo        `json:"egress"`
}

// policyReference is the NetworkPolicy; its namespace defaults to the
// object's.
type policyReference struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

type podEndpoint struct {
	HostIP    string `json:"hostIP"`
	PodIP     string `json:"podIP"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

// endpointInfo is a rule: a CIDR (or an address) with excepts and ports.
// DomainName is written by the controller v1.5.0 on egress rules (FQDN
// peers; api/v1alpha1/policyendpoints_types.go, EndpointInfo): it is not
// enforced, and an egress entry without a cidr allows nothing, as the AWS
// agent skips it (controllers/policyendpoints_controller.go).
type endpointInfo struct {
	CIDR       string     `json:"cidr"`
	DomainName string     `json:"domainName"`
	Except     []string   `json:"except"`
	Ports      []portInfo `json:"ports"`
}

// portInfo: a nil Protocol is TCP, a nil Port every port.
type portInfo struct {
	Protocol *string `json:"protocol"`
	Port     *int64  `json:"port"`
	EndPort  *int64  `json:"endPort"`
}

// objectList is a List, or a list of one kind (PolicyEndpointList); its
// items are decoded one by one, so that an error names its object.
type objectList struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ListMeta   `json:"metadata"`
	Items      []json.RawMessage `json:"items"`
}

// The wire shape of networking.k8s.aws/v1alpha1 ClusterPolicyEndpoint
// objects (cluster-scoped), as the AWS network policy controller writes
// them for a ClusterNetworkPolicy: api/v1alpha1/clusterpolicyendpoints_types.go
// of aws-network-policy-agent v1.5.0. Decoded strictly, as PolicyEndpoints.

// clusterPolicyEndpointObject is one ClusterPolicyEndpoint.
type clusterPolicyEndpointObject struct {
	APIVersion string                     `json:"apiVersion"`
	Kind       string                     `json:"kind"`
	Metadata   objectMeta                 `json:"metadata"`
	Spec       *clusterPolicyEndpointSpec `json:"spec"`
	Status     json.RawMessage            `json:"status"` // ignored
}

type clusterPolicyEndpointSpec struct {
	PolicyRef *clusterPolicyReference `json:"policyRef"`
	Tier      string                  `json:"tier"` // Admin, Baseline
	// Priority is an int64 so that a value out of int32 is told as out of
	// range, not as of the wrong type.
	Priority             *int64                `json:"priority"`
	PodSelectorEndpoints []podEndpoint         `json:"podSelectorEndpoints"`
	Ingress              []clusterEndpointInfo `json:"ingress"`
	Egress               []clusterEndpointInfo `json:"egress"`
}

// clusterPolicyReference is the ClusterNetworkPolicy (cluster-scoped: a
// name only).
type clusterPolicyReference struct {
	Name string `json:"name"`
}

// clusterEndpointInfo is a rule: a CIDR (or an address) and ports, and
// what to do with what it matches. DomainName is egress-only (FQDN peers):
// it is not enforced, and the AWS agent v1.5.0 skips an egress entry
// without a cidr (see cpeValidator.rules). There are no excepts.
type clusterEndpointInfo struct {
	CIDR       string     `json:"cidr"`
	Ports      []portInfo `json:"ports"`
	DomainName string     `json:"domainName"`
	Action     string     `json:"action"` // Accept, Deny, Pass
}
