package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cilium/statedb/reconciler"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/cobra"
)

// statusTables are the desired-state tables, whose rows carry a reconcile
// status; --verbose lists their rows in error.
var statusTables = []string{"masq-map-entries", "policy-map-entries", "eni-rules", "eni-routes"}

// statusCommand is `enimasq-dbg status`, like `cilium-dbg status`: one screen
// that says whether the agent does its job. It is built from the agent's
// health report and its Prometheus metrics (the API socket's /metrics), so
// it shows exactly what Prometheus scrapes.
func statusCommand(o *options) *cobra.Command {
	var verbose bool
	var format string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Summary: module health, rows by reconcile status, map pressure, IPAM pool (exit 1 when degraded, 2 when the agent is not running)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := agentStatus(o, verbose)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if format != "" {
				if err := printAs(w, format, rep); err != nil {
					return err
				}
			} else {
				writeStatus(w, rep)
			}
			if !rep.OK {
				return errDegraded
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&verbose, "verbose", false, "Also list the rows in error, with their reason")
	outputFlag(cmd, &format)
	return cmd
}

// statusReport is what status prints (-o json|yaml: as it is).
type statusReport struct {
	OK      bool                `json:"ok"`
	Modules []moduleHealth      `json:"modules"`
	Tables  map[string]rowCount `json:"tables,omitempty"`
	Maps    map[string]mapUse   `json:"maps,omitempty"`
	Pool    map[string]poolUse  `json:"ipamPool,omitempty"`
	Sources map[string]source   `json:"sources,omitempty"`
	// Policy is the policy programs' mode, when they run.
	Policy *policyMode `json:"policy,omitempty"`
	// ErrorRows are the rows in error (--verbose): "table key: error".
	ErrorRows []string `json:"errorRows,omitempty"`
}

type (
	rowCount struct {
		Done    float64 `json:"done"`
		Pending float64 `json:"pending"`
		Error   float64 `json:"error"`
	}
	mapUse struct {
		Entries  float64 `json:"entries"`
		Pressure float64 `json:"pressure"`
		// MaxEntries is the map's size (enimasq_bpf_map_capacity); 0 from
		// an agent that does not serve it.
		MaxEntries float64 `json:"maxEntries,omitempty"`
	}
	poolUse struct {
		Pool      float64 `json:"pool"`
		Used      float64 `json:"used"`
		Available float64 `json:"available"`
	}
	policyMode struct {
		Mode string `json:"mode"` // standard, strict
		// Audit: a packet the policy denies passes (--policy-audit-mode).
		Audit bool `json:"audit"`
	}
	source struct {
		// LastSuccess is the Unix time of the last good read, 0 for never.
		LastSuccess float64 `json:"lastSuccess"`
		Errors      float64 `json:"errors"`
	}
)

// agentMetrics fetches and parses the agent's /metrics.
func agentMetrics(o *options) (map[string]*dto.MetricFamily, error) {
	code, body, err := apiGet(o, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("metrics: agent answered %d", code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return families, nil
}

func agentStatus(o *options, verbose bool) (statusReport, error) {
	var rep statusReport
	_, body, err := apiGet(o, "/healthz")
	if err != nil {
		return rep, err
	}
	var health healthReport
	if err := json.Unmarshal(body, &health); err != nil {
		return rep, fmt.Errorf("health report: %w", err)
	}
	rep.OK, rep.Modules = health.OK, health.Modules
	families, err := agentMetrics(o)
	if err != nil {
		return rep, err
	}
	rep.Tables = map[string]rowCount{}
	for t, r := range byLabels(families, "enimasq_reconcile_rows", "table", "status") {
		rep.Tables[t] = rowCount{Done: r["done"], Pending: r["pending"], Error: r["error"]}
	}
	entries := byLabels(families, "enimasq_bpf_map_entries", "map", "")
	capacity := byLabels(families, "enimasq_bpf_map_capacity", "map", "")
	rep.Maps = map[string]mapUse{}
	for m, p := range byLabels(families, "enimasq_bpf_map_pressure", "map", "") {
		rep.Maps[m] = mapUse{Entries: entries[m][""], Pressure: p[""], MaxEntries: capacity[m][""]}
	}
	rep.Pool = map[string]poolUse{}
	for e, p := range byLabels(families, "enimasq_ipam_ips", "eni", "type") {
		rep.Pool[e] = poolUse{Pool: p["pool"], Used: p["used"], Available: p["available"]}
	}
	errs := byLabels(families, "enimasq_source_errors_total", "source", "")
	rep.Sources = map[string]source{}
	for src, last := range byLabels(families, "enimasq_source_last_success_timestamp_seconds", "source", "") {
		rep.Sources[src] = source{LastSuccess: last[""], Errors: errs[src][""]}
	}
	for _, m := range families["enimasq_policy_enforcement_info"].GetMetric() {
		p := &policyMode{}
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "mode":
				p.Mode = l.GetValue()
			case "audit":
				p.Audit = l.GetValue() == "true"
			}
		}
		rep.Policy = p
	}
	if verbose {
		if rep.ErrorRows, err = errorRows(o); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// byLabels indexes the samples of family name (gauges and counters) by the
// values of the labels row and col ("" for a family with one label):
// value[row][col].
func byLabels(families map[string]*dto.MetricFamily, name, row, col string) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for _, m := range families[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		r := labels[row]
		if out[r] == nil {
			out[r] = map[string]float64{}
		}
		value := m.GetGauge().GetValue()
		if m.Counter != nil {
			value = m.GetCounter().GetValue()
		}
		out[r][labels[col]] = value
	}
	return out
}

func writeStatus(out io.Writer, rep statusReport) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)

	overall := "OK"
	if !rep.OK {
		overall = "Degraded"
	}
	fmt.Fprintf(w, "Agent:\t%s\n", overall)
	fmt.Fprintln(w, "Modules:")
	for _, m := range rep.Modules {
		fmt.Fprintf(w, "  %s\t%s\n", m.Module, m.Level)
		for _, d := range m.Degraded {
			reason := d.Message
			if d.Error != "" && !strings.HasSuffix(reason, d.Error) {
				reason += ": " + d.Error
			}
			fmt.Fprintf(w, "    %s\t%s\n", d.Scope, reason)
		}
	}
	if p := rep.Policy; p != nil {
		mode := p.Mode
		if p.Audit {
			mode += ", AUDIT MODE: packets the policy denies pass (counted verdict=audit)"
		}
		fmt.Fprintf(w, "Policy enforcement:\t%s\n", mode)
	}
	if len(rep.Tables) > 0 {
		fmt.Fprintln(w, "Tables:\tdone\tpending\terror")
		for _, t := range sortedKeys(rep.Tables) {
			r := rep.Tables[t]
			fmt.Fprintf(w, "  %s\t%g\t%g\t%g\n", t, r.Done, r.Pending, r.Error)
		}
	}
	if len(rep.Maps) > 0 {
		fmt.Fprintln(w, "Maps:\tentries\tpressure")
		for _, m := range sortedKeys(rep.Maps) {
			fmt.Fprintf(w, "  %s\t%g\t%.2f%%\n", m, rep.Maps[m].Entries, 100*rep.Maps[m].Pressure)
		}
		writeMapCapacity(w, rep.Maps)
	}
	if len(rep.Pool) > 0 {
		fmt.Fprintln(w, "IPAM pool:\tpool\tused\tavailable")
		for _, e := range sortedKeys(rep.Pool) {
			p := rep.Pool[e]
			fmt.Fprintf(w, "  %s\t%g\t%g\t%g\n", e, p.Pool, p.Used, p.Available)
		}
	}
	if len(rep.Sources) > 0 {
		fmt.Fprintln(w, "Sources:\tlast good read\terrors")
		for _, src := range sortedKeys(rep.Sources) {
			when := "never"
			if t := rep.Sources[src].LastSuccess; t > 0 {
				when = time.Since(time.Unix(int64(t), 0)).Round(time.Second).String() + " ago"
			}
			fmt.Fprintf(w, "  %s\t%s\t%g\n", src, when, rep.Sources[src].Errors)
		}
	}
	w.Flush()
	if rep.ErrorRows != nil {
		fmt.Fprintln(out, "Rows in error:")
		for _, r := range rep.ErrorRows {
			fmt.Fprintf(out, "  %s\n", r)
		}
		if len(rep.ErrorRows) == 0 {
			fmt.Fprintln(out, "  none")
		}
	}
}

// writeMapCapacity adds a line per map of known size: entries/max entries
// and the percent used. A policy change holds a pod's keys twice while it
// is written (Documentation/network-policy.md, Capacity): a map past half
// full may not take the change of a policy that selects every pod.
func writeMapCapacity(w io.Writer, maps map[string]mapUse) {
	header := false
	for _, m := range sortedKeys(maps) {
		u := maps[m]
		if u.MaxEntries == 0 {
			continue
		}
		if !header {
			fmt.Fprintln(w, "Map capacity:\tentries/max\tused")
			header = true
		}
		fmt.Fprintf(w, "  %s\t%g/%g\t%.2f%%\n", m, u.Entries, u.MaxEntries, 100*u.Entries/u.MaxEntries)
	}
}

// errorRows lists the rows in error of the desired-state tables, as
// "table key: error" (an empty, non-nil list for none).
func errorRows(o *options) ([]string, error) {
	out := []string{}
	for _, table := range statusTables {
		code, body, err := apiGet(o, "/statedb/dump/"+table)
		if err != nil {
			return nil, err
		}
		if code != http.StatusOK {
			continue // the table is not in this agent
		}
		var dump map[string][]map[string]json.RawMessage
		if err := json.Unmarshal(body, &dump); err != nil {
			return nil, fmt.Errorf("dump %s: %w", table, err)
		}
		for _, row := range dump[table] {
			var st reconciler.Status
			if json.Unmarshal(row["Status"], &st) != nil || st.Kind != reconciler.StatusKindError {
				continue
			}
			delete(row, "Status")
			key, _ := json.Marshal(row)
			out = append(out, fmt.Sprintf("%s %s: %s", table, key, st.GetError()))
		}
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
