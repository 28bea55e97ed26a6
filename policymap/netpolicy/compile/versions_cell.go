package compile

import (
	"context"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/policymap"
	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

type versionsParams struct {
	cell.In
	Common registration

	Versions   statedb.RWTable[*PodVersions]
	Policy     statedb.RWTable[*PolicyMapEntry]
	Cluster    statedb.RWTable[*ClusterMapEntry]
	PEs        statedb.Table[*endpoints.PolicyEndpoint]
	CPEs       statedb.Table[*endpoints.ClusterPolicyEndpoint]
	State      *policyVersions
	PolicyOps  *policymap.Maps[*PolicyMapEntry]
	ClusterOps *policymap.Maps[*ClusterMapEntry]
}

// registerVersions opens enimasq_policy_versions, reconciles policy-versions
// into it and runs the switch (switch.go). The prunes of both tiers' maps
// keep the entries of the versions the kernel has in force.
func registerVersions(p versionsParams) error {
	c := p.Common
	if c.Settings.Off != "" {
		return nil
	}
	wtxn := c.DB.WriteTxn(p.Versions)
	initDone := p.Versions.RegisterInitializer(wtxn, "restore-policy-versions")
	wtxn.Commit()
	c.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			spec, err := versionsMapSpec()
			if err != nil {
				return err
			}
			if err := p.State.maps.Open(c.Log, spec, c.Node.GlobalsDir()); err != nil {
				return err
			}
			if err := p.State.restore(); err != nil {
				// Without them, a pod's old entries may be pruned before
				// its new version is in force: say so, go on with what the
				// tables say.
				c.Log.Warn("Cannot read the policy versions in force", "error", err)
			}
			// The versions in force go into the table before any deriver
			// writes a pod's row (they wait for ready), their keys are
			// read for the derivers to take over (adopt.go).
			restored := p.State.takeRestored()
			if len(restored) > 0 {
				kernel := [len(tiers)]map[string]bpf.PinnedMap{p.PolicyOps.Opened(), p.ClusterOps.Opened()}
				names := [len(tiers)][]string{policybpf.PolicyMapNames, policybpf.ClusterMapNames}
				a, n, err := readAdoptable(restored, kernel, names)
				if err != nil {
					// Without them, every restored pod gets a new version.
					c.Log.Warn("Cannot read the policy maps an earlier run left: every pod's policy is written anew", "error", err)
				}
				p.State.setAdoptable(a)
				c.Log.Info("Policy map entries in force read for adoption", "pods", len(restored), "entries", n)
			}
			wtxn := c.DB.WriteTxn(p.Versions)
			for pod, vs := range restored {
				row := &PodVersions{Pod: pod, Status: reconciler.StatusDone()}
				for i := range tiers {
					row.Tiers[i].Active = vs[i]
				}
				p.Versions.Insert(wtxn, row)
			}
			initDone(wtxn)
			wtxn.Commit()
			if len(restored) > 0 {
				c.Log.Info("Policy versions in force restored", "pods", len(restored))
			}
			p.State.markReady()
			return nil
		},
		OnStop: func(cell.HookContext) error {
			p.State.close()
			return nil
		},
	})
	p.State.db, p.State.table = c.DB, p.Versions
	p.PolicyOps.SetKeep(p.State.keep(policybpf.TierNetworkPolicy, p.PolicyOps.Opened))
	p.ClusterOps.SetKeep(p.State.keep(policybpf.TierCluster, p.ClusterOps.Opened))
	s := &versionSwitch{log: c.Log, db: c.DB, versions: p.Versions, policy: p.Policy, cluster: p.Cluster,
		pes: p.PEs, cpes: p.CPEs, state: p.State}
	c.Jobs.Add(job.OneShot("switch-policy-versions", s.run))
	c.Jobs.Add(job.Timer("check-policy-versions-pin", func(context.Context) error { return p.State.maps.CheckPins(c.Log) },
		c.Config.BPFMapRefreshInterval))
	_, err := policymap.RegisterReconciler(c.Reconcile, c.Jobs, c.Config, "policy-versions", p.Versions,
		(*PodVersions).Clone, (*PodVersions).SetStatus, (*PodVersions).GetStatus, p.State.maps.Ops(), p.State.maps.Ops())
	return err
}
