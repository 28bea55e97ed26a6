package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"
)

// allocation is the agent's answer to an allocation (the field names of
// Cilium's IPAMAddressResponse).
type allocation struct {
	IP              string   `json:"ip"`
	Gateway         string   `json:"gateway"`
	CIDRs           []string `json:"cidrs"`
	MasterMAC       string   `json:"master-mac"`
	InterfaceNumber string   `json:"interface-number"`
}

// allocationInfo is one row of GET /v1/ipam, and of the answers of a
// release and a GC.
type allocationInfo struct {
	IP          string `json:"ip"`
	Owner       string `json:"owner"`
	PodUID      string `json:"podUID,omitempty"`
	ContainerID string `json:"containerID,omitempty"`
	IfName      string `json:"ifname,omitempty"`
	Family      string `json:"family"`
	State       string `json:"state"`
}

// attachment is the CNI spec's attachment: container ID and interface name.
type attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

// allocationRequest is the body of POST /v1/ipam.
type allocationRequest struct {
	Owner       string `json:"owner"`
	PodUID      string `json:"podUID,omitempty"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
	Family      string `json:"family"`
}

// apiError is the agent's error answer.
type apiError struct {
	Message string `json:"error"`
	Reason  string `json:"reason"`
	Code    int    `json:"-"`
}

func (e *apiError) Error() string {
	return fmt.Sprintf("agent: %s (%s, %d)", e.Message, e.Reason, e.Code)
}

// agentClient talks to the enimasq-agent API on its unix socket.
type agentClient struct {
	socket string
	http   *http.Client
}

func newAgentClient(socket string, timeout time.Duration) *agentClient {
	return &agentClient{
		socket: socket,
		http: &http.Client{
			Timeout: timeout,
			Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", socket)
			}},
		},
	}
}

// errAgentDown is returned when nothing answers on the socket.
type errAgentDown struct {
	socket string
	err    error
}

func (e errAgentDown) Error() string {
	return fmt.Sprintf("enimasq-agent is not running (cannot connect to %s: %v)", e.socket, e.err)
}

func (c *agentClient) do(method, path string, body any, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://agent"+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return 0, errAgentDown{c.socket, op.Err}
		}
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode >= 300 {
		e := &apiError{Code: resp.StatusCode}
		if json.Unmarshal(data, e) == nil && e.Message != "" {
			return resp.StatusCode, e
		}
		return resp.StatusCode, fmt.Errorf("agent answered %d: %s", resp.StatusCode, bytes.TrimSpace(data))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("agent answer: %w", err)
		}
	}
	return resp.StatusCode, nil
}

// allocate asks for an IP for the request's attachment and waits until its
// rules are Done. created is false when the attachment already held the IP
// (a retried ADD): the allocation is then not this call's to undo.
func (c *agentClient) allocate(req allocationRequest, wait int) (a *allocation, created bool, err error) {
	a = &allocation{}
	path := fmt.Sprintf("/v1/ipam?wait=true&timeout=%ds", wait)
	code, err := c.do(http.MethodPost, path, req, a)
	if err != nil {
		return nil, false, err
	}
	return a, code == http.StatusCreated, nil
}

// release frees ip; an IP the agent does not know is released already.
func (c *agentClient) release(ip string) error {
	code, err := c.do(http.MethodDelete, "/v1/ipam/"+url.PathEscape(ip), nil, nil)
	if code == http.StatusNotFound {
		return nil
	}
	return err
}

// releaseAttachment frees the IPs of one attachment and returns them (none
// when the agent holds nothing for it).
func (c *agentClient) releaseAttachment(att attachment) ([]allocationInfo, error) {
	var released []allocationInfo
	_, err := c.do(http.MethodPost, "/v1/ipam/release", att, &released)
	return released, err
}

// gc frees the IPs of every attachment not in valid and returns them.
func (c *agentClient) gc(valid []attachment) ([]allocationInfo, error) {
	if valid == nil {
		valid = []attachment{}
	}
	var released []allocationInfo
	_, err := c.do(http.MethodPost, "/v1/ipam/gc", map[string][]attachment{"validAttachments": valid}, &released)
	return released, err
}

// attachmentAllocations returns the allocations an attachment holds.
func (c *agentClient) attachmentAllocations(att attachment) ([]allocationInfo, error) {
	var list []allocationInfo
	q := url.Values{"containerID": {att.ContainerID}, "ifname": {att.IfName}}
	_, err := c.do(http.MethodGet, "/v1/ipam?"+q.Encode(), nil, &list)
	return list, err
}

// legacyAllocations returns the allocations of family without an
// attachment whose owner is one of owners: allocations of a version-1
// checkpoint (or of an API client) that belong to the pod.
func (c *agentClient) legacyAllocations(owners []string, family string) ([]allocationInfo, error) {
	var list []allocationInfo
	if _, err := c.do(http.MethodGet, "/v1/ipam", nil, &list); err != nil {
		return nil, err
	}
	var out []allocationInfo
	for _, a := range list {
		if a.ContainerID == "" && a.Family == family && slices.Contains(owners, a.Owner) {
			out = append(out, a)
		}
	}
	return out, nil
}

func (c *agentClient) healthy() error {
	_, err := c.do(http.MethodGet, "/healthz", nil, nil)
	return err
}
