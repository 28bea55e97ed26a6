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

	"github.com/enimasq/enimasq/ipam/ipamapi"
)

// apiError is the agent's error answer.
type apiError struct {
	Body ipamapi.Error
	Code int
}

func (e *apiError) Error() string {
	return fmt.Sprintf("agent: %s (%s, %d)", e.Body.Message, e.Body.Reason, e.Code)
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
		if json.Unmarshal(data, &e.Body) == nil && e.Body.Message != "" {
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
func (c *agentClient) allocate(req ipamapi.Request, wait int) (a *ipamapi.AllocationResult, created bool, err error) {
	a = &ipamapi.AllocationResult{}
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
func (c *agentClient) releaseAttachment(att ipamapi.Attachment) ([]ipamapi.AllocationInfo, error) {
	var released []ipamapi.AllocationInfo
	_, err := c.do(http.MethodPost, "/v1/ipam/release", att, &released)
	return released, err
}

// gc frees the IPs of every attachment of network not in valid and returns
// them.
func (c *agentClient) gc(network string, valid []ipamapi.Attachment) ([]ipamapi.AllocationInfo, error) {
	if valid == nil {
		valid = []ipamapi.Attachment{}
	}
	var released []ipamapi.AllocationInfo
	_, err := c.do(http.MethodPost, "/v1/ipam/gc", ipamapi.GCRequest{Network: network, ValidAttachments: valid}, &released)
	return released, err
}

// attachmentAllocations returns the allocations an attachment holds.
func (c *agentClient) attachmentAllocations(att ipamapi.Attachment) ([]ipamapi.AllocationInfo, error) {
	var list []ipamapi.AllocationInfo
	q := url.Values{"network": {att.Network}, "containerID": {att.ContainerID}, "ifname": {att.IfName}}
	_, err := c.do(http.MethodGet, "/v1/ipam?"+q.Encode(), nil, &list)
	return list, err
}

// legacyAllocations returns the allocations of family without an
// attachment whose owner is one of owners, restored from a version-1
// checkpoint: the CNI's, made before attachments were recorded. An API
// client's allocation of the same owner is not the CNI's: never listed.
func (c *agentClient) legacyAllocations(owners []string, family string) ([]ipamapi.AllocationInfo, error) {
	var list []ipamapi.AllocationInfo
	if _, err := c.do(http.MethodGet, "/v1/ipam", nil, &list); err != nil {
		return nil, err
	}
	var out []ipamapi.AllocationInfo
	for _, a := range list {
		if a.V1 && a.ContainerID == "" && a.Family == family && slices.Contains(owners, a.Owner) {
			out = append(out, a)
		}
	}
	return out, nil
}

// canAllocate asks the agent whether an ADD of family would get an IP now.
func (c *agentClient) canAllocate(family string) error {
	_, err := c.do(http.MethodGet, "/v1/ipam/status?"+url.Values{"family": {family}}.Encode(), nil, nil)
	return err
}
