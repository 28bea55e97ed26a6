package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/enimasq/enimasq/cells/agentapi"
	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/allocator"
	"github.com/enimasq/enimasq/ipam/ipamapi"
)

// apiDo sends a request with a JSON body to the agent API and decodes a
// JSON answer into out. An error answer becomes an error with the agent's
// message and reason (an *agentapi.APIError).
func apiDo(o *options, method, path string, body, out any, timeout time.Duration) error {
	code, err := agentapi.NewClient(o.socket(), timeout).Do(method, path, body, out)
	var e *agentapi.APIError
	if err != nil && !errors.As(err, &e) && (code == http.StatusNotFound || code == http.StatusMethodNotAllowed) {
		return fmt.Errorf("%w: is ENI IPAM in this agent?", err)
	}
	return err
}

// standingResult is the result of an allocation that stands in the error
// answer err (its rules failed while waiting), or nil.
func standingResult(err error) *ipamapi.AllocationResult {
	var ie *agentapi.APIError
	var body ipamapi.Error
	if !errors.As(err, &ie) || json.Unmarshal(ie.Answer, &body) != nil {
		return nil
	}
	return body.Result
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// ipamCommand is `enimasq-dbg ipam`: allocate, release and list pod IPs
// through the agent API, as the CNI plugin does.
func ipamCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ipam",
		Short: "Allocate, release and list pod IPs (ENI IPAM)",
	}

	var owner, family, ip string
	var wait bool
	allocate := &cobra.Command{
		Use:   "allocate --owner NAMESPACE/POD [--family ipv4|ipv6] [--ip IP]",
		Short: "Allocate an IP for a pod and print the result as JSON",
		Long: "Allocate an IP for a pod (the next free one, or --ip) and print the allocation result\n" +
			"(ip, gateway, cidrs, master-mac, interface-number). Asking again for the same pod gives\n" +
			"the same IP. With --wait (the default) it returns once the pod's ip rules and its ENI's\n" +
			"routes are in the kernel, or fails with the reason (the IP stays allocated).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := "/v1/ipam"
			if wait {
				path += "?wait=true"
			}
			var result allocator.AllocationResult
			err := apiDo(o, http.MethodPost, path, allocator.Request{Owner: owner, Family: family, IP: ip}, &result,
				allocator.WaitTimeout+10*time.Second)
			if standing := standingResult(err); standing != nil {
				printJSON(cmd.OutOrStdout(), standing)
				return fmt.Errorf("%s allocated, but: %w", standing.IP, err)
			}
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), result)
		},
	}
	allocate.Flags().StringVar(&owner, "owner", "", "The pod, as NAMESPACE/POD (required)")
	allocate.Flags().StringVar(&family, "family", "", "Address family: ipv4 (default) or ipv6")
	allocate.Flags().StringVar(&ip, "ip", "", "Ask for this IP instead of the next free one")
	allocate.Flags().BoolVar(&wait, "wait", true, "Wait until the pod's rules and routes are in the kernel")
	allocate.MarkFlagRequired("owner")

	release := &cobra.Command{
		Use:   "release IP",
		Short: "Release an allocated IP; the pod's rules are removed",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, err := netip.ParseAddr(args[0])
			if err != nil {
				return fmt.Errorf("%q is not an IP address", args[0])
			}
			var info allocator.AllocationInfo
			if err := apiDo(o, http.MethodDelete, "/v1/ipam/"+url.PathEscape(addr.String()), nil, &info, 10*time.Second); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "released %s (%s)\n", info.IP, info.Owner)
			return nil
		},
	}

	var format string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the allocations: IP, owner, attachment (container ID/ifname, - for none), ENI, state (and why, when not Allocated)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var infos []allocator.AllocationInfo
			if err := apiDo(o, http.MethodGet, "/v1/ipam", nil, &infos, 10*time.Second); err != nil {
				return err
			}
			if format != "" {
				if infos == nil {
					infos = []allocator.AllocationInfo{}
				}
				return printAs(cmd.OutOrStdout(), format, infos)
			}
			t := newTable(cmd.OutOrStdout(), "IP", "OWNER", "ATTACHMENT", "ENI", "STATE")
			for _, a := range infos {
				eni := a.ENI
				if eni == "" {
					eni = "-"
				}
				state := a.State
				if a.State != string(allocations.StateAllocated) && a.Reason != "" {
					state += ": " + a.Reason
				}
				t.row(a.IP, a.Owner, a.Attachment().String(), eni, state)
			}
			return t.flush()
		},
	}
	outputFlag(list, &format)

	cmd.AddCommand(allocate, release, list)
	return cmd
}
