package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// fqdnRow is a row of policy-fqdn as -o json|yaml prints it.
type fqdnRow struct {
	Pod     netip.Addr `json:"pod"`
	PodName string     `json:"podName"`
	Name    string     `json:"name"`
	IPs     []fqdnIP   `json:"ips"`
	Rules   []string   `json:"rules,omitempty"`
}

type fqdnIP struct {
	IP      netip.Addr `json:"ip"`
	Expires time.Time  `json:"expires"`
}

// fqdnRows reads policy-fqdn from the agent: the names its pods were told,
// sorted by pod and name.
func fqdnRows(o *options) ([]fqdnRow, error) {
	code, body, err := apiGet(o, "/statedb/dump/"+endpoints.DNSNamesTableName)
	if err != nil {
		return nil, fmt.Errorf("read %s from the agent: %w", endpoints.DNSNamesTableName, err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("read %s from the agent: HTTP %d: %s", endpoints.DNSNamesTableName, code, strings.TrimSpace(string(body)))
	}
	var dump map[string][]endpoints.DNSName
	if err := json.Unmarshal(body, &dump); err != nil {
		return nil, fmt.Errorf("read %s from the agent: %w", endpoints.DNSNamesTableName, err)
	}
	var out []fqdnRow
	for _, r := range dump[endpoints.DNSNamesTableName] {
		row := fqdnRow{Pod: r.Pod, PodName: r.PodName, Name: r.Name, Rules: r.Rules}
		for _, ip := range r.IPs {
			row.IPs = append(row.IPs, fqdnIP(ip))
		}
		out = append(out, row)
	}
	slices.SortFunc(out, func(a, b fqdnRow) int {
		if c := a.Pod.Compare(b.Pod); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// namesBehind returns the names a pod was told an address is (for policy
// verdict); nil if none or the agent cannot be asked.
func namesBehind(o *options, pod, ip netip.Addr) []string {
	rows, err := fqdnRows(o)
	if err != nil {
		return nil
	}
	var out []string
	for _, r := range rows {
		if r.Pod == pod && slices.ContainsFunc(r.IPs, func(i fqdnIP) bool { return i.IP == ip }) {
			out = append(out, r.Name)
		}
	}
	return out
}

// policyFQDNCommand is `policy fqdn [--pod IP] [-o json|yaml]`.
func policyFQDNCommand(o *options) *cobra.Command {
	var pod, format string
	cmd := &cobra.Command{
		Use:   "fqdn [--pod IP]",
		Short: "The names the pods were told (policy-fqdn): pod, name, addresses, expiry, the entries that asked",
		Long: "Lists what the DNS proxy learnt from the answers to the lookups of the pods that\n" +
			"domainName entries select: per pod and name asked, each address with its expiry\n" +
			"(the answer's TTL, at least --tofqdns-min-ttl), and the entries whose pattern\n" +
			"matched. Those addresses are what the entries allow the pod.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rows, err := fqdnRows(o)
			if err != nil {
				return err
			}
			if pod != "" {
				p, err := netip.ParseAddr(pod)
				if err != nil {
					return fmt.Errorf("--pod: %w", err)
				}
				rows = slices.DeleteFunc(rows, func(r fqdnRow) bool { return r.Pod != p })
			}
			if rows == nil {
				rows = []fqdnRow{}
			}
			if format != "" {
				return printAs(cmd.OutOrStdout(), format, rows)
			}
			now := time.Now()
			t := newTable(cmd.OutOrStdout(), "POD", "POD-NAME", "NAME", "IP", "EXPIRES", "RULES")
			for _, r := range rows {
				for _, ip := range r.IPs {
					t.row(r.Pod.String(), orDash(r.PodName), r.Name, ip.IP.String(),
						fmt.Sprintf("in %s", ip.Expires.Sub(now).Round(time.Second)), orDash(strings.Join(r.Rules, "; ")))
				}
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&pod, "pod", "", "Only this pod IP's names")
	outputFlag(cmd, &format)
	return cmd
}
