package main

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/enimasq/enimasq/cells/agentapi"
	"github.com/enimasq/enimasq/ipam/ipamapi"
)

// agentClient is the agent API's client with the calls the plugin makes.
type agentClient struct{ *agentapi.Client }

func newAgentClient(socket string, timeout time.Duration) *agentClient {
	return &agentClient{agentapi.NewClient(socket, timeout)}
}

// allocate asks for an IP for the request's attachment and waits until its
// rules are Done. created is false when the attachment already held the IP
// (a retried ADD): the allocation is then not this call's to undo.
func (c *agentClient) allocate(req ipamapi.Request, wait int) (a *ipamapi.AllocationResult, created bool, err error) {
	a = &ipamapi.AllocationResult{}
	path := fmt.Sprintf("/v1/ipam?wait=true&timeout=%ds", wait)
	code, err := c.Do(http.MethodPost, path, req, a)
	if err != nil {
		return nil, false, err
	}
	return a, code == http.StatusCreated, nil
}

// release frees ip; an IP the agent does not know is released already.
func (c *agentClient) release(ip string) error {
	code, err := c.Do(http.MethodDelete, "/v1/ipam/"+url.PathEscape(ip), nil, nil)
	if code == http.StatusNotFound {
		return nil
	}
	return err
}

// releaseAttachment frees the IPs of one attachment and returns them (none
// when the agent holds nothing for it).
func (c *agentClient) releaseAttachment(att ipamapi.Attachment) ([]ipamapi.AllocationInfo, error) {
	var released []ipamapi.AllocationInfo
	_, err := c.Do(http.MethodPost, "/v1/ipam/release", att, &released)
	return released, err
}

// gc frees the IPs of every attachment of network not in valid and returns
// them.
func (c *agentClient) gc(network string, valid []ipamapi.Attachment) ([]ipamapi.AllocationInfo, error) {
	if valid == nil {
		valid = []ipamapi.Attachment{}
	}
	var released []ipamapi.AllocationInfo
	_, err := c.Do(http.MethodPost, "/v1/ipam/gc", ipamapi.GCRequest{Network: network, ValidAttachments: valid}, &released)
	return released, err
}

// attachmentAllocations returns the allocations an attachment holds.
func (c *agentClient) attachmentAllocations(att ipamapi.Attachment) ([]ipamapi.AllocationInfo, error) {
	var list []ipamapi.AllocationInfo
	q := url.Values{"network": {att.Network}, "containerID": {att.ContainerID}, "ifname": {att.IfName}}
	_, err := c.Do(http.MethodGet, "/v1/ipam?"+q.Encode(), nil, &list)
	return list, err
}

// legacyAllocations returns the allocations of family without an
// attachment whose owner is one of owners, restored from a version-1
// checkpoint: the CNI's, made before attachments were recorded. An API
// client's allocation of the same owner is not the CNI's: never listed.
func (c *agentClient) legacyAllocations(owners []string, family string) ([]ipamapi.AllocationInfo, error) {
	var list []ipamapi.AllocationInfo
	if _, err := c.Do(http.MethodGet, "/v1/ipam", nil, &list); err != nil {
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
	_, err := c.Do(http.MethodGet, "/v1/ipam/status?"+url.Values{"family": {family}}.Encode(), nil, nil)
	return err
}
