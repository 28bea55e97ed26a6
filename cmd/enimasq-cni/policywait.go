package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"

	"github.com/enimasq/enimasq/cells/agentapi"
)

// policyAnswer is the agent's answer to GET /v1/policy/devices/{device}
// (enforce.DeviceAnswer).
type policyAnswer struct {
	Device   string `json:"device"`
	Ifindex  int    `json:"ifindex"`
	Enforced bool   `json:"enforced"`
	Reason   string `json:"reason"`
}

// waitPolicy waits until the agent's policy programs are on the pod's host
// device and its maps hold the pod's IP, when the agent enforces network
// policy on the pod (strict mode, or a policy selects it); it returns at
// once when it does not. An agent without the policy API (404 without an
// agent error) enforces nothing.
func (c *agentClient) waitPolicy(device string, ip netip.Addr, wait int) error {
	var answer policyAnswer
	path := fmt.Sprintf("/v1/policy/devices/%s?%s", url.PathEscape(device),
		url.Values{"ip": {ip.String()}, "timeout": {fmt.Sprintf("%ds", wait)}}.Encode())
	code, err := c.Do(http.MethodGet, path, nil, &answer)
	var agentErr *agentapi.APIError
	if code == http.StatusNotFound && !errors.As(err, &agentErr) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("waiting for the policy programs: %w", err)
	}
	return nil
}
