package k8sclient

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
)

// Cell provides *Client from the --k8s-* flags and reports, as the module's
// health, whether the API server answers: OK with its version, or Degraded
// with the error while it is retried with backoff. A disabled client is OK
// ("Disabled ...") and never contacts anything.
var Cell = cell.Module(
	"k8s-client",
	"Kubernetes API server client",

	cell.Config(DefaultConfig),
	cell.Provide(NewClient),
	cell.Invoke(registerProbe),
)

// How often a connected client checks that the API server still answers,
// and the backoff bounds while it does not. Variables for the tests.
var (
	heartbeatInterval = 30 * time.Second
	probeTimeout      = 10 * time.Second
	retryMin          = 1 * time.Second
	retryMax          = 30 * time.Second
)

type probeParams struct {
	cell.In

	Client *Client
	Log    *slog.Logger
	Jobs   job.Group
	Health cell.Health
}

func registerProbe(p probeParams) {
	c := p.Client
	if !c.IsEnabled() {
		p.Log.Info("No Kubernetes API server: --k8s-kubeconfig-path is empty and KUBERNETES_SERVICE_HOST is unset", "node", c.NodeName())
		p.Health.OK(fmt.Sprintf("Disabled: no --k8s-kubeconfig-path and not in a pod (node %s)", c.NodeName()))
		return
	}
	p.Log.Info("Kubernetes API server", "host", c.Host(), "config", c.Source(), "node", c.NodeName())
	p.Jobs.Add(job.OneShot("api-server-probe", func(ctx context.Context, health cell.Health) error {
		probe(ctx, p.Log, health, c)
		return nil
	}))
}

// probe reports the API server's reachability until ctx ends.
func probe(ctx context.Context, log *slog.Logger, health cell.Health, c *Client) {
	backoff := retryMin
	connected := false
	for {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		info, err := c.ServerVersion(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		wait := heartbeatInterval
		if err == nil {
			if !connected {
				// client-go's errors of the outage may be logged again.
				clientGoSeen.reset()
				log.Info("Connected to the Kubernetes API server", "host", c.Host(), "version", info.GitVersion)
			}
			connected, backoff = true, retryMin
			health.OK(fmt.Sprintf("Connected to %s (Kubernetes %s) with the %s, node %s",
				c.Host(), info.GitVersion, c.Source(), c.NodeName()))
		} else {
			if connected {
				log.Warn("Kubernetes API server unreachable", "host", c.Host(), "error", err)
			}
			connected = false
			wait = backoff
			backoff = min(2*backoff, retryMax)
			health.Degraded(fmt.Sprintf("API server %s unreachable, retrying in %s", c.Host(), wait), err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
