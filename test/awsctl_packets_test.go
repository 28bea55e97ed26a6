package test

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"sync"
)

// packets sends a packet for each row that sel picks, is TCP or UDP and
// whose ends answer: a TCP connection (the SYN, the SYN-ACK and the data)
// or a UDP datagram and its echo. Its expected outcome is the reference's
// verdict, and the other end's when it is a pod of this node (its own
// egress or ingress). A failed probe that should have passed is tried
// twice more (a slow machine may lose one; a pass cannot be a fluke).
func (e *awsEnv) packets(rows []*awsRow, sel func(*awsRow) bool) {
	t := e.t
	t.Helper()
	e.waitAttached()
	var todo []*awsRow
	for _, r := range rows {
		if (r.q.Proto != "tcp" && r.q.Proto != "udp") || !sel(r) || !e.answering[r.q.Peer] || !e.answering[e.world.pod(r.q.Pod).IP] {
			continue
		}
		r.sent, r.want = true, r.ref.Allow
		if other := e.world.podByIP(netip.MustParseAddr(r.q.Peer)); other != nil && other.Local && r.ref.Allow {
			back := awsQuery{Pod: other.key(), Dir: "ingress", Peer: e.world.pod(r.q.Pod).IP, Proto: r.q.Proto, Port: r.q.Port}
			if r.q.Dir == "ingress" {
				back.Dir = "egress"
			}
			ans, err := e.world.Verdict(back)
			if err != nil {
				t.Fatal(err)
			}
			if !ans.Allow {
				r.want = false
				r.why = fmt.Sprintf("%s %s: %s", other.Name, back.Dir, ans)
			}
		}
		todo = append(todo, r)
	}
	work := make(chan *awsRow)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range work {
				for try := 0; try < 3; try++ {
					if r.passed = e.probe(r.q); r.passed || !r.want {
						break
					}
				}
			}
		}()
	}
	for _, r := range todo {
		work <- r
	}
	close(work)
	wg.Wait()
}

// probe sends the query's packet for real: egress from the pod's netns,
// ingress from the peer's (a pod of this node: its netns; the node: the
// node netns; else the peer netns, from that address).
func (e *awsEnv) probe(q awsQuery) bool {
	pod := e.world.pod(q.Pod)
	if q.Dir == "egress" {
		return dialFrom(e.node.ns[e.node.podNS(pod.Name)], q.Proto, "", q.Peer, int(q.Port))
	}
	switch other := e.world.podByIP(netip.MustParseAddr(q.Peer)); {
	case other != nil && other.Local:
		return dialFrom(e.node.ns[e.node.podNS(other.Name)], q.Proto, "", pod.IP, int(q.Port))
	case q.Peer == awsNodeIP:
		return dialFrom(e.node.ns[e.node.Node], q.Proto, q.Peer, pod.IP, int(q.Port))
	default:
		return dialFrom(e.node.ns[e.node.peerNS()], q.Proto, q.Peer, pod.IP, int(q.Port))
	}
}

// awsAllPackets sends the packet of every case that can have one.
func awsAllPackets(*awsRow) bool { return true }

// awsPacketSample picks the packets of a churn step: those of the cases the
// step names, those whose reference changed with the step, and a third of
// the others (by a hash of the case, the same third every step).
func awsPacketSample(step []awsCase, before map[awsQuery]awsAnswer) func(*awsRow) bool {
	return func(r *awsRow) bool {
		if slices.Contains(step, r.k) {
			return true
		}
		if old, ok := before[r.q]; !ok || old.Allow != r.ref.Allow {
			return true
		}
		h := fnv.New32a()
		h.Write([]byte(r.k.String()))
		return h.Sum32()%3 == 0
	}
}

// waitAttached waits until the programs are on the device of every pod of
// this node (before packets are judged).
func (e *awsEnv) waitAttached() {
	e.t.Helper()
	n := 0
	for _, p := range e.world.Pods {
		if p.Local {
			n++
		}
	}
	waitAttached(e.agent, n)
}
