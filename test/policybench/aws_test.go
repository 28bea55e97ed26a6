package policybench

import (
	"testing"

	"github.com/enimasq/enimasq/test/awspeer"
)

func awsFrame(tb testing.TB, port uint16) []byte {
	tb.Helper()
	f, err := awspeer.Frame(pod, peer, 40000, port)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// newAWS loads the AWS agent's program with n TCP port entries on each of
// the pod's peer prefixes and, if cluster is not nil, the cluster rules on
// clusterPeer; it checks the tiers of the denied packets from their events
// and, if fill, then fills the events ring (the agent's default).
func newAWS(tb testing.TB, n int, cluster []awspeer.ClusterRule, fill bool) *awspeer.Peer {
	tb.Helper()
	p, err := awspeer.New()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	rules := make([]awspeer.PortRule, n)
	for i := range rules {
		rules[i] = awspeer.PortRule{Protocol: awspeer.ProtocolTCP, StartPort: uint32(entryPort(i))}
	}
	cp := awspeer.DefaultAllow
	if cluster != nil {
		cp = awspeer.PoliciesApplied
	}
	must(tb, p.SetPodState(awspeer.PoliciesApplied, cp))
	for _, pfx := range peerPrefixes() {
		must(tb, p.AddNetworkPolicy(pfx, rules))
	}
	if cluster != nil {
		must(tb, p.AddClusterPolicy(clusterPeer, cluster))
	}
	check := func(port uint16, tier awspeer.Tier) {
		tb.Helper()
		verdict, _, err := p.Run(awsFrame(tb, port), 1)
		must(tb, err)
		events, err := p.Events()
		must(tb, err)
		if verdict != awspeer.VerdictShot || len(events) != 1 || events[0].Tier != tier {
			tb.Fatalf("aws, port %d: verdict %d, events %+v; want a drop in tier %d", port, verdict, events, tier)
		}
	}
	check(deniedPort(n), awspeer.TierNetworkPolicy)
	if cluster != nil {
		check(adminPort, awspeer.TierAdmin)
	}
	if fill {
		must(tb, p.FillEvents())
	}
	must(tb, p.ResetConntrack())
	return p
}
