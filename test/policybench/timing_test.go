package policybench

import (
	"fmt"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/enimasq/enimasq/test/awspeer"
)

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// timed runs frame repeat times in one BPF_PROG_TEST_RUN and returns the
// kernel's time per run, checking the last run's return code.
func timed(p *ebpf.Program, frame []byte, repeat int, want uint32) (float64, error) {
	ret, d, err := p.Benchmark(frame, repeat, nil)
	if err != nil {
		return 0, err
	}
	if ret != want {
		return 0, fmt.Errorf("returned %#x, want %#x", ret, want)
	}
	return float64(d.Nanoseconds()), nil
}

func awsTimed(p *awspeer.Peer, frame []byte, repeat int, want uint32) (float64, error) {
	verdict, d, err := p.Run(frame, repeat)
	if err != nil {
		return 0, err
	}
	if verdict != want {
		return 0, fmt.Errorf("verdict %d, want %d", verdict, want)
	}
	return float64(d.Nanoseconds()), nil
}

// eventsRead is the mean time per run of eventCalls calls of eventRuns
// runs, the ring drained before the first and after each (drain returns
// how many records it read: one a run).
func eventsRead(p *ebpf.Program, frame []byte, want uint32, drain func() (int, error)) (float64, error) {
	if _, err := drain(); err != nil {
		return 0, err
	}
	var total float64
	for range eventCalls {
		v, err := timed(p, frame, eventRuns, want)
		if err != nil {
			return 0, err
		}
		total += v
		n, err := drain()
		if err != nil {
			return 0, err
		}
		if n != eventRuns {
			return 0, fmt.Errorf("%d events after %d runs", n, eventRuns)
		}
	}
	return total / eventCalls, nil
}
