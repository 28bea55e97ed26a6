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

// allocationInfo is one row of GET /v1/ipam.
type allocationInfo struct {
	IP    string `json:"ip"`
	Owner string `json:"owner"`
}

type apiError struct {
	Message string `json:"error"`
	Reason  string `json:"reason"`
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
		var e apiError
		if json.Unmarshal(data, &e) == nil && e.Message != "" {
			return resp.StatusCode, fmt.Errorf("agent: %s (%s, %d)", e.Message, e.Reason, resp.StatusCode)
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

// allocate asks for an IP for owner and waits until its rules are Done.
// created is false when the owner already held the IP (a retried ADD): the
// allocation is then not this call's to undo.
func (c *agentClient) allocate(owner, family string, wait int) (a *allocation, created bool, err error) {
	a = &allocation{}
	path := fmt.Sprintf("/v1/ipam?wait=true&timeout=%ds", wait)
	code, err := c.do(http.MethodPost, path, map[string]string{"owner": owner, "family": family}, a)
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

// ownedBy returns the IPs allocated to owner.
func (c *agentClient) ownedBy(owner string) ([]string, error) {
	var list []allocationInfo
	if _, err := c.do(http.MethodGet, "/v1/ipam", nil, &list); err != nil {
		return nil, err
	}
	var ips []string
	for _, a := range list {
		if a.Owner == owner {
			ips = append(ips, a.IP)
		}
	}
	return ips, nil
}

func (c *agentClient) healthy() error {
	_, err := c.do(http.MethodGet, "/healthz", nil, nil)
	return err
}
