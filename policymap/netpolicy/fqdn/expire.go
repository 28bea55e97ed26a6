package fqdn

import (
	"context"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/enimasq/enimasq/policymap/netpolicy/endpoints"
)

// expire takes the addresses out of policy-fqdn when they expire (the
// compiler then takes them out of the kernel; connections opened while
// they were allowed live on in the connection table). It sleeps until the
// next expiry or a change of the table.
func (l *learner) expire(ctx context.Context, h cell.Health) error {
	h.OK("Expiring the names' addresses")
	for {
		txn := l.db.ReadTxn()
		now := l.now()
		var next time.Time
		var due []*endpoints.DNSName
		rows, watch := l.names.AllWatch(txn)
		for row := range rows {
			for _, ip := range row.IPs {
				if !ip.Expires.After(now) {
					due = append(due, row)
					break
				}
				if next.IsZero() || ip.Expires.Before(next) {
					next = ip.Expires
				}
			}
		}
		if len(due) > 0 {
			l.sweep(now)
			continue
		}
		var timer *time.Timer
		var fire <-chan time.Time
		if !next.IsZero() {
			timer = time.NewTimer(next.Sub(now))
			fire = timer.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// sweep drops the addresses expired at now, and the rows left empty.
func (l *learner) sweep(now time.Time) {
	wtxn := l.db.WriteTxn(l.names)
	defer wtxn.Commit()
	for row := range l.names.All(wtxn) {
		var keep []endpoints.NameIP
		for _, ip := range row.IPs {
			if ip.Expires.After(now) {
				keep = append(keep, ip)
			}
		}
		switch {
		case len(keep) == len(row.IPs):
		case len(keep) == 0:
			l.names.Delete(wtxn, row)
			l.forget(row.Key())
		default:
			c := *row
			c.IPs = keep
			l.names.Insert(wtxn, &c)
		}
	}
}
