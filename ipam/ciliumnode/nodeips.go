package ciliumnode

import (
	"context"
	"fmt"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/enimasq/enimasq/cells/nodeips"
)

type nodeIPsParams struct {
	cell.In

	DB   *statedb.DB
	ENIs statedb.Table[*ENI]
	Jobs job.Group
	// NodeIPs, when the agent has the table, gets the ENIs' primary IPs.
	NodeIPs statedb.RWTable[*nodeips.NodeIP] `optional:"true"`
}

// registerNodeIPs keeps the ENIs' primary IPs in node-ips (source "eni"):
// they are this node's addresses, whether or not an interface of the
// namespace carries them. node-ips is initialized for this source once enis
// is, so that nobody decides "not this node's" from a table that lacks them.
func registerNodeIPs(p nodeIPsParams) {
	if p.NodeIPs == nil {
		return
	}
	wtxn := p.DB.WriteTxn(p.NodeIPs)
	initDone := p.NodeIPs.RegisterInitializer(wtxn, "node-ips-eni")
	wtxn.Commit()
	p.Jobs.Add(job.OneShot("publish-eni-addresses", func(ctx context.Context, health cell.Health) error {
		for {
			rtxn := p.DB.ReadTxn()
			enis, watch := p.ENIs.AllWatch(rtxn)
			var addrs []*nodeips.NodeIP
			for e := range enis {
				if e.PrimaryIP.IsValid() {
					addrs = append(addrs, &nodeips.NodeIP{Addr: e.PrimaryIP, Source: nodeips.SourceENI, Device: e.ID})
				}
			}
			initialized, _ := p.ENIs.Initialized(rtxn)
			wtxn := p.DB.WriteTxn(p.NodeIPs)
			nodeips.Sync(wtxn, p.NodeIPs, nodeips.SourceENI, addrs)
			if initialized && initDone != nil {
				initDone(wtxn)
				initDone = nil
			}
			wtxn.Commit()
			health.OK(fmt.Sprintf("%d ENI primary IPs", len(addrs)))
			if initDone != nil {
				// Wake up when enis is initialized, too.
				_, initWatch := p.ENIs.Initialized(rtxn)
				select {
				case <-ctx.Done():
					return nil
				case <-watch:
				case <-initWatch:
				}
				continue
			}
			select {
			case <-ctx.Done():
				return nil
			case <-watch:
			}
		}
	}))
}
