package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

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

// sample is one sample of a family: its labels and value.
type sample struct {
	labels map[string]string
	value  float64
}

func samples(families map[string]*dto.MetricFamily, name string) []sample {
	f, ok := families[name]
	if !ok {
		return nil
	}
	var out []sample
	for _, m := range f.GetMetric() {
		s := sample{labels: map[string]string{}}
		for _, l := range m.GetLabel() {
			s.labels[l.GetName()] = l.GetValue()
		}
		switch {
		case m.Gauge != nil:
			s.value = m.GetGauge().GetValue()
		case m.Counter != nil:
			s.value = m.GetCounter().GetValue()
		}
		out = append(out, s)
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

	rows := map[string]map[string]float64{}
	for _, s := range samples(families, "enimasq_reconcile_rows") {
		t := s.labels["table"]
		if rows[t] == nil {
			rows[t] = map[string]float64{}
		}
		rows[t][s.labels["status"]] = s.value
	}
	if len(rows) > 0 {
		fmt.Fprintln(w, "Tables:\tdone\tpending\terror")
		for _, t := range sortedKeys(rows) {
			r := rows[t]
			fmt.Fprintf(w, "  %s\t%g\t%g\t%g\n", t, r["done"], r["pending"], r["error"])
		}
	}

	entries := map[string]float64{}
	for _, s := range samples(families, "enimasq_bpf_map_entries") {
		entries[s.labels["map"]] = s.value
	}
	if pressure := samples(families, "enimasq_bpf_map_pressure"); len(pressure) > 0 {
		fmt.Fprintln(w, "Maps:\tentries\tpressure")
		slices.SortFunc(pressure, func(a, b sample) int { return strings.Compare(a.labels["map"], b.labels["map"]) })
		for _, s := range pressure {
			fmt.Fprintf(w, "  %s\t%g\t%.2f%%\n", s.labels["map"], entries[s.labels["map"]], 100*s.value)
		}
	}

	pool := map[string]map[string]float64{}
	for _, s := range samples(families, "enimasq_ipam_ips") {
		e := s.labels["eni"]
		if pool[e] == nil {
			pool[e] = map[string]float64{}
		}
		pool[e][s.labels["type"]] = s.value
	}
	if len(pool) > 0 {
		fmt.Fprintln(w, "IPAM pool:\tpool\tused\tavailable")
		for _, e := range sortedKeys(pool) {
			p := pool[e]
			fmt.Fprintf(w, "  %s\t%g\t%g\t%g\n", e, p["pool"], p["used"], p["available"])
		}
	}

	errs := map[string]float64{}
	for _, s := range samples(families, "enimasq_source_errors_total") {
		errs[s.labels["source"]] = s.value
	}
	if last := samples(families, "enimasq_source_last_success_timestamp_seconds"); len(last) > 0 {
		fmt.Fprintln(w, "Sources:\tlast good read\terrors")
		slices.SortFunc(last, func(a, b sample) int { return strings.Compare(a.labels["source"], b.labels["source"]) })
		for _, s := range last {
			when := "never"
			if s.value > 0 {
				when = time.Since(time.Unix(int64(s.value), 0)).Round(time.Second).String() + " ago"
			}
			fmt.Fprintf(w, "  %s\t%s\t%g\n", s.labels["source"], when, errs[s.labels["source"]])
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
			var st struct {
				Kind  string  `json:"kind"`
				Error *string `json:"error"`
			}
			if json.Unmarshal(row["Status"], &st) != nil || st.Kind != "error" {
				continue
			}
			delete(row, "Status")
			key, _ := json.Marshal(row)
			reason := ""
			if st.Error != nil {
				reason = *st.Error
			}
			fmt.Fprintf(w, "  %s %s: %s\n", table, key, reason)
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
