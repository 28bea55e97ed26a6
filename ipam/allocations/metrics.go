package allocations

import (
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/enimasq/enimasq/ipam/ciliumnode"
)

// poolIPs is enimasq_ipam_ips{eni, type}: per usable ENI, the IPs of its
// pool, those used (allocated) and those available, at scrape time.
type poolIPs struct {
	db     *statedb.DB
	enis   statedb.Table[*ciliumnode.ENI]
	allocs statedb.Table[*Allocation]
	desc   *prometheus.Desc
}

func (c *poolIPs) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *poolIPs) Collect(ch chan<- prometheus.Metric) {
	txn := c.db.ReadTxn()
	used := map[string]int{}
	for a := range c.allocs.All(txn) {
		if a.ENI != "" && a.State == StateAllocated {
			used[a.ENI]++
		}
	}
	for e := range c.enis.All(txn) {
		if !e.Usable() {
			continue
		}
		pool, u := len(e.Pool), used[e.ID]
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(pool), e.ID, "pool")
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(u), e.ID, "used")
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(max(pool-u, 0)), e.ID, "available")
	}
}
