package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
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
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Summary: module health, rows by reconcile status, map pressure, IPAM pool (exit 1 when degraded)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, body, err := apiGet(o, "/healthz")
			if err != nil {
				return err
			}
			var rep healthReport
			if err := json.Unmarshal(body, &rep); err != nil {
				return fmt.Errorf("health report: %w", err)
			}
			code, body, err := apiGet(o, "/metrics")
			if err != nil {
				return err
			}
			if code != http.StatusOK {
				return fmt.Errorf("metrics: agent answered %d", code)
			}
			parser := expfmt.NewTextParser(model.UTF8Validation)
			families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
			if err != nil {
				return fmt.Errorf("metrics: %w", err)
			}
			w := cmd.OutOrStdout()
			writeStatus(w, rep, families)
			if verbose {
				if err := writeErrorRows(w, o); err != nil {
					return err
				}
			}
			if !rep.OK {
				return errors.New("agent is degraded")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&verbose, "verbose", false, "Also list the rows in error, with their reason")
	return cmd
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

func writeStatus(out io.Writer, rep healthReport, families map[string]*dto.MetricFamily) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	defer w.Flush()

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
			if d.Error != "" {
				reason += ": " + d.Error
			}
			fmt.Fprintf(w, "    %s\t%s\n", d.Scope, reason)
		}
	}

	rows := byLabels(families, "enimasq_reconcile_rows", "table", "status")
	if len(rows) > 0 {
		fmt.Fprintln(w, "Tables:\tdone\tpending\terror")
		for _, t := range sortedKeys(rows) {
			r := rows[t]
			fmt.Fprintf(w, "  %s\t%g\t%g\t%g\n", t, r["done"], r["pending"], r["error"])
		}
	}

	entries := byLabels(families, "enimasq_bpf_map_entries", "map", "")
	if pressure := byLabels(families, "enimasq_bpf_map_pressure", "map", ""); len(pressure) > 0 {
		fmt.Fprintln(w, "Maps:\tentries\tpressure")
		for _, m := range sortedKeys(pressure) {
			fmt.Fprintf(w, "  %s\t%g\t%.2f%%\n", m, entries[m][""], 100*pressure[m][""])
		}
	}

	pool := byLabels(families, "enimasq_ipam_ips", "eni", "type")
	if len(pool) > 0 {
		fmt.Fprintln(w, "IPAM pool:\tpool\tused\tavailable")
		for _, e := range sortedKeys(pool) {
			p := pool[e]
			fmt.Fprintf(w, "  %s\t%g\t%g\t%g\n", e, p["pool"], p["used"], p["available"])
		}
	}

	errs := byLabels(families, "enimasq_source_errors_total", "source", "")
	if last := byLabels(families, "enimasq_source_last_success_timestamp_seconds", "source", ""); len(last) > 0 {
		fmt.Fprintln(w, "Sources:\tlast good read\terrors")
		for _, src := range sortedKeys(last) {
			when := "never"
			if t := last[src][""]; t > 0 {
				when = time.Since(time.Unix(int64(t), 0)).Round(time.Second).String() + " ago"
			}
			fmt.Fprintf(w, "  %s\t%s\t%g\n", src, when, errs[src][""])
		}
	}
}

// writeErrorRows lists the rows in error of the desired-state tables.
func writeErrorRows(w io.Writer, o *options) error {
	fmt.Fprintln(w, "Rows in error:")
	n := 0
	for _, table := range statusTables {
		code, body, err := apiGet(o, "/statedb/dump/"+table)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			continue // the table is not in this agent
		}
		var dump map[string][]map[string]json.RawMessage
		if err := json.Unmarshal(body, &dump); err != nil {
			return fmt.Errorf("dump %s: %w", table, err)
		}
		for _, row := range dump[table] {
			var st reconciler.Status
			if json.Unmarshal(row["Status"], &st) != nil || st.Kind != reconciler.StatusKindError {
				continue
			}
			delete(row, "Status")
			key, _ := json.Marshal(row)
			fmt.Fprintf(w, "  %s %s: %s\n", table, key, st.GetError())
			n++
		}
	}
	if n == 0 {
		fmt.Fprintln(w, "  none")
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
