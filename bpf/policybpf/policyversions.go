package policybpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// The versions of the pods' policies (c/policy.c, enimasq_policy_versions).
//
// Every key of a policy map carries the version of the pod's policy it
// belongs to, and the programs look a pod's keys up at the version this
// map holds for the pod, per tier (the NetworkPolicy maps and the cluster
// maps). The agent writes every key of a pod's new version, then switches
// the pod to it here (one map update), then deletes the old version's keys:
// a pod's policy changes in one step, and a version that cannot be written
// whole never comes into force.
const (
	// PolicyVersionsMapName is the hash of the pods' versions: pod address
	// (PolicyPodKey) -> {u32 NetworkPolicy version; u32 cluster version}.
	PolicyVersionsMapName = "enimasq_policy_versions"

	// PolicyVersionNone is the version of a pod without an entry: its keys
	// are never written, so the pod has no policy of the tier.
	PolicyVersionNone uint32 = 0
	// PolicyVersionClosed denies every packet of the pod: its first
	// version could not be written whole (fail closed).
	PolicyVersionClosed uint32 = 0xffffffff

	// PolicyVersionValueSize is the size of a versions entry.
	PolicyVersionValueSize = 8
)

// PolicyTier is a tier of policy maps with its own version.
type PolicyTier int

const (
	// TierNetworkPolicy is the NetworkPolicy maps (PolicyEndpoints).
	TierNetworkPolicy PolicyTier = 0
	// TierCluster is the cluster maps (ClusterPolicyEndpoints).
	TierCluster PolicyTier = 1
)

// policyVersionsHighWaterKey is a key of the versions map that is no pod
// address (family 0xff): its value holds, in the first word, the version
// numbers handed out so far, so that an agent that restarts never hands
// out a version whose keys an earlier run may have left in the maps.
var policyVersionsHighWaterKey = func() []byte {
	k := make([]byte, 20)
	k[0] = 0xff
	return k
}()

// PolicyVersionsHighWaterKey is the key of the high-water mark of the
// versions handed out (not a pod's).
func PolicyVersionsHighWaterKey() []byte { return append([]byte(nil), policyVersionsHighWaterKey...) }

// IsPolicyVersionsHighWaterKey says whether a key of the versions map is
// the high-water mark.
func IsPolicyVersionsHighWaterKey(k []byte) bool {
	return string(k) == string(policyVersionsHighWaterKey)
}

// PolicyVersionsSpec is the spec of the versions map.
func PolicyVersionsSpec() (*ebpf.MapSpec, error) {
	spec, err := loadPolicy()
	if err != nil {
		return nil, fmt.Errorf("load policy program spec: %w", err)
	}
	m, ok := spec.Maps[PolicyVersionsMapName]
	if !ok {
		return nil, errors.New("policy program spec: no " + PolicyVersionsMapName)
	}
	return m.Copy(), nil
}

// EncodePolicyVersions is the value of a pod's versions entry.
func EncodePolicyVersions(networkPolicy, cluster uint32) []byte {
	b := make([]byte, 0, PolicyVersionValueSize)
	b = binary.NativeEndian.AppendUint32(b, networkPolicy)
	return binary.NativeEndian.AppendUint32(b, cluster)
}

// DecodePolicyVersions decodes a versions entry.
func DecodePolicyVersions(v []byte) (networkPolicy, cluster uint32, err error) {
	if len(v) != PolicyVersionValueSize {
		return 0, 0, fmt.Errorf("%s value %x: %d bytes, want %d", PolicyVersionsMapName, v, len(v), PolicyVersionValueSize)
	}
	return binary.NativeEndian.Uint32(v), binary.NativeEndian.Uint32(v[4:]), nil
}

// PolicyVersions reads every pod's versions from the map, and the
// high-water mark of the versions handed out.
func PolicyVersions(m interface {
	NextKey(key, nextKeyOut any) error
	Lookup(key, valueOut any) error
}) (pods map[netip.Addr][2]uint32, highWater uint32, err error) {
	pods = map[netip.Addr][2]uint32{}
	var key []byte
	for {
		next := make([]byte, len(policyVersionsHighWaterKey))
		var err error
		if key == nil {
			err = m.NextKey(nil, next)
		} else {
			err = m.NextKey(key, next)
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return pods, highWater, nil
		}
		if err != nil {
			return nil, 0, fmt.Errorf("list %s: %w", PolicyVersionsMapName, err)
		}
		key = next
		v := make([]byte, PolicyVersionValueSize)
		if err := m.Lookup(key, v); errors.Is(err, ebpf.ErrKeyNotExist) {
			continue // deleted meanwhile
		} else if err != nil {
			return nil, 0, fmt.Errorf("list %s: %w", PolicyVersionsMapName, err)
		}
		np, cl, _ := DecodePolicyVersions(v)
		if IsPolicyVersionsHighWaterKey(key) {
			highWater = np
			continue
		}
		pod, ok := PolicyPodOfKey(key)
		if !ok {
			return nil, 0, fmt.Errorf("%s: key %x is no pod address", PolicyVersionsMapName, key)
		}
		pods[pod] = [2]uint32{np, cl}
	}
}

// SetPolicyVersionsHighWater writes the high-water mark of the versions
// handed out.
func SetPolicyVersionsHighWater(m interface{ Put(key, value any) error }, highWater uint32) error {
	if err := m.Put(policyVersionsHighWaterKey, EncodePolicyVersions(highWater, 0)); err != nil {
		return fmt.Errorf("%s: write the versions' high-water mark: %w", PolicyVersionsMapName, err)
	}
	return nil
}
