package netpolicy

import (
	"strings"
	"testing"

	"github.com/enimasq/enimasq/cells/k8sclient"
	"github.com/enimasq/enimasq/test/k8stest"
)

func TestPolicySourceConflict(t *testing.T) {
	kubeconfig := k8stest.UnreachableKubeconfig(t)
	enabled, err := k8sclient.NewClient(k8sclient.Config{K8sKubeconfigPath: kubeconfig, K8sNodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	withPath := DefaultPolicyConfig
	withPath.EnableNetworkPolicy, withPath.PolicyEndpointsPath, withPath.PolicyMapMaxEntries = true, "/pe", 1
	noPath := withPath
	noPath.PolicyEndpointsPath = ""
	if err := checkPolicySource(withPath, nil); err != nil {
		t.Errorf("file source: %v", err)
	}
	if err := checkPolicySource(noPath, enabled); err != nil {
		t.Errorf("API source: %v", err)
	}
	if err := checkPolicySource(withPath, enabled); err == nil || !strings.Contains(err.Error(), "--policy-endpoints-path /pe is set and the Kubernetes API server is enabled") {
		t.Errorf("both: %v", err)
	}
	if err := noPath.validate(true); err != nil {
		t.Errorf("no path with the API: %v", err)
	}
	if err := noPath.validate(false); err == nil {
		t.Error("no path without the API: no error")
	}
}

func TestPolicyEventLogsFlag(t *testing.T) {
	if DefaultPolicyConfig.PolicyEventLogs {
		t.Error("--policy-event-logs is on by default")
	}
	on := DefaultPolicyConfig
	on.PolicyEventLogs = true
	if err := on.validate(true); err == nil || !strings.Contains(err.Error(), "--policy-event-logs needs --enable-network-policy") {
		t.Errorf("events without network policy: %v", err)
	}
	on.EnableNetworkPolicy = true
	if err := on.validate(true); err != nil {
		t.Errorf("events with network policy: %v", err)
	}
	s := newEnforceSettings(enforceParams{Policy: on})
	if !s.Events {
		t.Errorf("enforce.Settings.Events is off with --policy-event-logs")
	}
	if s := newEnforceSettings(enforceParams{Policy: on.withEvents(false)}); s.Events {
		t.Errorf("enforce.Settings.Events is on without --policy-event-logs")
	}
}

func (c PolicyConfig) withEvents(on bool) PolicyConfig { c.PolicyEventLogs = on; return c }
