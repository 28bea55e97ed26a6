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
	"net/netip"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/enimasq/enimasq/ipam/allocations"
	"github.com/enimasq/enimasq/ipam/allocator"
	"github.com/spf13/cobra"
)

// apiDo sends a request with a JSON body to the agent API and decodes a
// JSON answer into out. An error answer becomes an error with the agent's
// message and reason; for "rules-failed" the result is printed to w first
// (the IP is allocated).
func apiDo(o *options, method, path string, body, out any, timeout time.Duration) error {
	sock := o.socket()
	client := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
		},
	}
	var reqBody io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		reqBody = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, "http://agent"+path, reqBody)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return errNotRunning(sock, err)
		}
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var e allocator.APIError
		if json.Unmarshal(data, &e) != nil || e.Message == "" {
			if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
				return fmt.Errorf("agent answered %d to %s %s: is ENI IPAM in this agent? (%s)", resp.StatusCode, method, path, strings.TrimSpace(string(data)))
			}
			return fmt.Errorf("agent answered %d: %s", resp.StatusCode, strings.TrimSpace(string(data)))
		}
		return &ipamError{code: resp.StatusCode, APIError: e}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("agent answer to %s %s: %w", method, path, err)
		}
	}
	return nil
}

type ipamError struct {
	code int
	allocator.APIError
}

func (e *ipamError) Error() string {
	return fmt.Sprintf("%s (%s, %d)", e.Message, e.Reason, e.code)
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
			var ie *ipamError
			if errors.As(err, &ie) && ie.Result != nil {
				printJSON(cmd.OutOrStdout(), ie.Result)
				return fmt.Errorf("%s allocated, but: %w", ie.Result.IP, err)
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

	list := &cobra.Command{
		Use:   "list",
		Short: "List the allocations, one a line: IP, owner, attachment (container ID/ifname, - for none), ENI (and the state when it is not Allocated)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var infos []allocator.AllocationInfo
			if err := apiDo(o, http.MethodGet, "/v1/ipam", nil, &infos, 10*time.Second); err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 8, 2, ' ', 0)
			for _, a := range infos {
				eni := a.ENI
				if eni == "" {
					eni = "-"
				}
				line := a.IP + "\t" + a.Owner + "\t" + a.Attachment().String() + "\t" + eni
				if a.State != string(allocations.StateAllocated) {
					line += "\t" + a.State
					if a.Reason != "" {
						line += ": " + a.Reason
					}
				}
				fmt.Fprintln(w, line)
			}
			return w.Flush()
		},
	}

	cmd.AddCommand(allocate, release, list)
	return cmd
}
