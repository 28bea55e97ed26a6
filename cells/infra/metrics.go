package infra

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/cells/metrics"
)

// MetricsConfig is where Prometheus scrapes the standalone agent.
type MetricsConfig struct {
	PrometheusServeAddr string `mapstructure:"prometheus-serve-addr"`
}

func (def MetricsConfig) Flags(flags *pflag.FlagSet) {
	flags.String("prometheus-serve-addr", def.PrometheusServeAddr,
		`Serve Prometheus metrics (/metrics) on this address, e.g. ":9962"; off when empty. They are always on the API socket`)
}

// Registry is the agent's Prometheus registry: enimasq's collectors (the
// "enimasq-metrics" group), the reconciler metrics, and the Go and process
// collectors.
type Registry struct {
	*prometheus.Registry
}

func newRegistry(rec *metrics.Reconciler, health *HealthRegistry, group metrics.In) (*Registry, error) {
	reg := prometheus.NewRegistry()
	if err := metrics.Register(reg, append([]prometheus.Collector{
		rec,
		metrics.BuildInfo(),
		newModuleHealth(health),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}, group.Collectors...)); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return &Registry{reg}, nil
}

// Health levels, as values of enimasq_module_health's level label.
var healthLevels = map[string]cell.Level{"ok": cell.StatusOK, "degraded": cell.StatusDegraded, "stopped": cell.StatusStopped}

// moduleHealth is enimasq_module_health{module, level}, as Cilium's
// cilium_hive_status: per module, 1 for its level (the worst of its
// scopes: ok, degraded or stopped) and 0 for the others; a module whose
// scopes have not reported yet (Unknown) has 0 for all three.
type moduleHealth struct {
	health *HealthRegistry
	desc   *prometheus.Desc
}

func newModuleHealth(h *HealthRegistry) *moduleHealth {
	return &moduleHealth{health: h, desc: prometheus.NewDesc(metrics.Namespace+"_module_health",
		"A module's health: 1 for its level (ok, degraded, stopped), 0 for the others", []string{"module", "level"}, nil)}
}

func (c *moduleHealth) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *moduleHealth) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.health.Report().Modules {
		for label, level := range healthLevels {
			v := 0.0
			if cell.Level(m.Level) == level {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, m.Module, label)
		}
	}
}

// Handler serves the registry in Prometheus' text format.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.Registry, promhttp.HandlerOpts{})
}

// teeMetrics sends reconciler metrics to expvar (/debug/vars) and Prometheus.
type teeMetrics []reconciler.Metrics

func (t teeMetrics) ReconciliationDuration(id cell.FullModuleID, name, op string, d time.Duration) {
	for _, m := range t {
		m.ReconciliationDuration(id, name, op, d)
	}
}

func (t teeMetrics) ReconciliationErrors(id cell.FullModuleID, name string, new, current int) {
	for _, m := range t {
		m.ReconciliationErrors(id, name, new, current)
	}
}

func (t teeMetrics) PruneError(id cell.FullModuleID, name string, err error) {
	for _, m := range t {
		m.PruneError(id, name, err)
	}
}

func (t teeMetrics) PruneDuration(id cell.FullModuleID, name string, d time.Duration) {
	for _, m := range t {
		m.PruneDuration(id, name, d)
	}
}

// metricsCommand is `metrics [-w] [regexp]`: the registry's samples (text
// format, without HELP/TYPE) matching regexp. With -w it waits until one
// does: metrics the reconcilers update after committing a status have no
// watch channel, so it polls the registry (in memory) until the script's
// deadline.
func metricsCommand(r *Registry) hive.ScriptCmdOut {
	return hive.NewScriptCmd("metrics", script.Command(
		script.CmdUsage{Summary: "Print the Prometheus samples matching the optional regexp (-w: wait until one does)", Args: "[-w] [regexp]"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			wait := len(args) > 0 && args[0] == "-w"
			if wait {
				args = args[1:]
			}
			var re *regexp.Regexp
			if len(args) > 0 {
				var err error
				if re, err = regexp.Compile(args[0]); err != nil {
					return nil, err
				}
			}
			if wait && re == nil {
				return nil, script.ErrUsage
			}
			for {
				text, err := r.Text()
				if err != nil {
					return nil, err
				}
				var b strings.Builder
				for _, line := range strings.Split(text, "\n") {
					if line == "" || strings.HasPrefix(line, "#") || (re != nil && !re.MatchString(line)) {
						continue
					}
					b.WriteString(line + "\n")
				}
				if !wait || b.Len() > 0 {
					out := b.String()
					return func(*script.State) (string, string, error) { return out, "", nil }, nil
				}
				select {
				case <-s.Context().Done():
					return nil, fmt.Errorf("no sample matches %q: %w", args[0], s.Context().Err())
				case <-time.After(10 * time.Millisecond):
				}
			}
		}))
}

// Text is the registry in Prometheus' text format.
func (r *Registry) Text() (string, error) {
	families, err := r.Gather()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			return "", err
		}
	}
	return b.String(), nil
}

type metricsServerParams struct {
	cell.In

	Lifecycle cell.Lifecycle
	Log       *slog.Logger
	Health    cell.Health
	Config    MetricsConfig
	Registry  *Registry
}

// registerMetricsServer serves /metrics on --prometheus-serve-addr.
func registerMetricsServer(p metricsServerParams) {
	addr := p.Config.PrometheusServeAddr
	if addr == "" {
		p.Health.OK("Not serving Prometheus metrics (--prometheus-serve-addr is empty); they are on the API socket at /metrics")
		return
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", p.Registry.Handler())
	serveHTTP(p.Lifecycle, p.Log, p.Health, "Prometheus metrics", timeouts{read: 10 * time.Second, idle: time.Minute}, mux, func() (net.Listener, error) {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("--prometheus-serve-addr %s: %w", addr, err)
		}
		return l, nil
	})
}

// metricsServerCell serves the registry on --prometheus-serve-addr.
var metricsServerCell = cell.Module(
	"prometheus",
	"Prometheus metrics server",

	cell.Config(MetricsConfig{}),
	cell.Invoke(registerMetricsServer),
)
