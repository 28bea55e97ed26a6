package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	stdmaps "maps"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq/bpf"
	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/agentapi"
	"github.com/enimasq/enimasq/policymap/netpolicy/enforce"
	netpolicy "github.com/enimasq/enimasq/policymap/netpolicy/inspect"
)

// verdictArgs are the flags of one query.
type verdictArgs struct {
	pod, peer, direction, proto string
	port                        uint16
}

func (a *verdictArgs) register(fs *pflag.FlagSet) {
	fs.StringVar(&a.pod, "pod", "", "The pod's IP (required)")
	fs.StringVar(&a.peer, "peer", "", "The peer's IP, of the pod's family (required)")
	fs.StringVar(&a.direction, "direction", "egress", "egress (the pod sends) or ingress (the pod receives)")
	fs.StringVar(&a.proto, "proto", "tcp", "tcp, udp, sctp, icmp, icmpv6 or a protocol number")
	fs.Uint16Var(&a.port, "port", 0, "Destination port (required for tcp, udp and sctp)")
}

func (a *verdictArgs) query(fs *pflag.FlagSet) (netpolicy.VerdictQuery, error) {
	if a.pod == "" || a.peer == "" {
		return netpolicy.VerdictQuery{}, errors.New("--pod and --peer are required")
	}
	args := []string{a.direction, a.pod, a.peer, a.proto}
	if fs.Changed("port") {
		args = append(args, strconv.Itoa(int(a.port)))
	}
	return netpolicy.ParseVerdictQuery(args)
}

// parseQueryLine parses a line of --stdin: the flags of one query
// ("--pod 10.0.0.5 --peer 10.1.2.3 --proto udp --port 53"), or the shell's
// "direction pod peer protocol [port]".
func parseQueryLine(line string) (netpolicy.VerdictQuery, error) {
	fields := strings.Fields(line)
	if len(fields) > 0 && !strings.HasPrefix(fields[0], "-") {
		return netpolicy.ParseVerdictQuery(fields)
	}
	var a verdictArgs
	fs := pflag.NewFlagSet("query", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a.register(fs)
	if err := fs.Parse(fields); err != nil {
		return netpolicy.VerdictQuery{}, err
	}
	if fs.NArg() > 0 {
		return netpolicy.VerdictQuery{}, fmt.Errorf("unexpected %q", fs.Arg(0))
	}
	return a.query(fs)
}

// verdictJSON is a verdict as -o json|yaml prints it.
type verdictJSON struct {
	Query   string `json:"query"`
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
	// Step is the deciding step (admin, namespace, baseline, default);
	// Object the deciding object, when known.
	Step         string           `json:"step"`
	Object       string           `json:"object,omitempty"`
	Map          string           `json:"map"`
	Entry        *policyEntryJSON `json:"entry,omitempty"`
	ClusterMap   string           `json:"clusterMap"`
	ClusterEntry *policyEntryJSON `json:"clusterEntry,omitempty"`
	Interval     int              `json:"interval"`
	// Program says which program judged: "agent" (the one the agent
	// keeps loaded) or "loaded" (loaded by this call).
	Program string `json:"program,omitempty"`
	// Names are the names the pod was told the peer is (policy-fqdn): an
	// address a domainName entry allows.
	Names []string `json:"names,omitempty"`
	Error string   `json:"error,omitempty"`
}

func toJSON(v netpolicy.Verdict) verdictJSON {
	out := verdictJSON{Query: v.Query.String(), Verdict: "DENY", Reason: v.Result.Reason.String(), Step: v.Result.Step.String(),
		Object: v.Object, Map: v.Map, ClusterMap: v.Cluster, Interval: v.Result.Interval}
	switch {
	case v.Result.Audited:
		out.Verdict = "AUDIT"
	case v.Result.Allow:
		out.Verdict = "ALLOW"
	}
	if v.Entry != nil {
		e := entryJSON(*v.Entry)
		out.Entry = &e
	}
	if v.ClusterEntry != nil {
		e := entryJSON(*v.ClusterEntry)
		out.ClusterEntry = &e
	}
	return out
}

func policyCommand(o *options) *cobra.Command {
	var q verdictArgs
	var stdin, exitCode bool
	var format string
	cmd := &cobra.Command{Use: "policy", Short: "Network policy on this node (reads the pinned maps; needs root)"}
	cmd.PersistentFlags().StringVar(&o.bpfRoot, "bpf-root", "", bpfRootUsage)
	verdict := &cobra.Command{
		Use:   "verdict (--pod IP --peer IP [--direction D] [--proto P] [--port N] | --stdin)",
		Short: "Run the policy verdict program on the pinned maps for a packet: ALLOW or DENY, and the entry that decided",
		Long: "Builds a packet between --pod and --peer (egress: from the pod; ingress: to the pod)\n" +
			"with the protocol and destination port, runs enimasq's tc verdict program on it with\n" +
			"BPF_PROG_TEST_RUN against the pinned maps, and prints ALLOW or DENY with the pod's\n" +
			"longest matching key and the port entry that allowed. With the agent in audit mode\n" +
			"(--policy-audit-mode) a packet the policy denies passes: AUDIT, with the step and\n" +
			"the object that would deny it.\n\n" +
			"The running agent runs the program it keeps loaded (POST /v1/policy/verdict): no\n" +
			"program is loaded per call. Without an agent (or with another --bpf-root than its\n" +
			"own) the program is loaded here, through the verifier.\n\n" +
			"--stdin reads one query a line, in the flags' syntax (\"--pod 10.0.0.5 --peer 10.1.2.3\n" +
			"--proto udp --port 53\") or as \"egress 10.0.0.5 10.1.2.3 udp 53\", and answers one line\n" +
			"each, in order (a query that cannot be read: \"ERROR <query>: <why>\"). With\n" +
			"--exit-code it exits 1 when a verdict is DENY.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var queries []netpolicy.VerdictQuery
			var errs []error // per query, nil when it parsed
			var lines []string
			if stdin {
				sc := bufio.NewScanner(cmd.InOrStdin())
				sc.Buffer(make([]byte, 64<<10), 1<<20)
				for sc.Scan() {
					line := strings.TrimSpace(sc.Text())
					if line == "" || strings.HasPrefix(line, "#") {
						continue
					}
					qq, err := parseQueryLine(line)
					queries, errs, lines = append(queries, qq), append(errs, err), append(lines, line)
				}
				if err := sc.Err(); err != nil {
					return fmt.Errorf("stdin: %w", err)
				}
			} else {
				qq, err := q.query(cmd.Flags())
				if err != nil {
					return err
				}
				queries, errs, lines = []netpolicy.VerdictQuery{qq}, []error{nil}, []string{""}
			}
			verdicts, verrs, program, err := judge(o, queries, errs)
			if err != nil {
				return err
			}
			names := func(v netpolicy.Verdict) []string {
				if !v.Result.Allow || v.Query.Direction != policybpf.Egress {
					return nil
				}
				return namesBehind(o, v.Query.Pod, v.Query.Peer)
			}
			return printVerdicts(cmd.OutOrStdout(), format, program, stdin, exitCode, lines, verdicts, verrs, names)
		},
	}
	q.register(verdict.Flags())
	verdict.Flags().BoolVar(&stdin, "stdin", false, "Read the queries from stdin, one a line")
	verdict.Flags().BoolVar(&exitCode, "exit-code", false, "Exit 1 when a verdict is DENY")
	verdict.MarkFlagsMutuallyExclusive("stdin", "pod")
	verdict.MarkFlagsMutuallyExclusive("stdin", "peer")
	outputFlag(verdict, &format)
	cmd.AddCommand(verdict, policyEventsCommand(o), policyFQDNCommand(o))
	return cmd
}

// printVerdicts prints the verdicts; names gives the names behind an
// allowed peer (nil: none).
func printVerdicts(w io.Writer, format, program string, many, exitCode bool, lines []string, verdicts []netpolicy.Verdict, errs []error, names func(netpolicy.Verdict) []string) error {
	failed, denied := 0, false
	var out []verdictJSON
	for i, v := range verdicts {
		if errs[i] != nil {
			failed++
			if format != "" {
				out = append(out, verdictJSON{Query: lines[i], Verdict: "ERROR", Error: errs[i].Error()})
			} else {
				fmt.Fprintf(w, "ERROR %s: %v\n", lines[i], errs[i])
			}
			continue
		}
		denied = denied || !v.Result.Allow
		var behind []string
		if names != nil {
			behind = names(v)
		}
		if format != "" {
			j := toJSON(v)
			j.Program, j.Names = program, behind
			out = append(out, j)
		} else if len(behind) > 0 {
			fmt.Fprintf(w, "%s (fqdn: %s)\n", v, strings.Join(behind, ", "))
		} else {
			fmt.Fprintln(w, v)
		}
	}
	if format != "" {
		var doc any = out
		if !many {
			doc = out[0]
		}
		if err := printAs(w, format, doc); err != nil {
			return err
		}
	}
	switch {
	case !many && failed > 0:
		return errs[0]
	case failed > 0:
		return fmt.Errorf("%d of %d queries failed", failed, len(verdicts))
	case exitCode && denied:
		return silentExit{exitFailed}
	}
	return nil
}

// judge answers the queries (errs: those that did not parse, skipped) from
// the agent's loaded program when the agent runs on the maps of this
// --bpf-root, else from a program loaded here. The entries that decided
// are read from the pinned maps. program is "agent" or "loaded".
func judge(o *options, queries []netpolicy.VerdictQuery, errs []error) (_ []netpolicy.Verdict, _ []error, program string, _ error) {
	verdicts := make([]netpolicy.Verdict, len(queries))
	agentRoot := agentBPFRoot(o)
	root := o.bpfRoot
	if root == "" {
		root = agentRoot
	}
	if root == "" {
		root = defaultBPFRoot
	}
	maps, err := openPolicyMaps(root, true)
	if err != nil {
		return nil, nil, "", err
	}
	defer closeMaps(maps)
	// The entries (and the verdict the entries give, a check of the
	// program's).
	var valid []int
	for i, q := range queries {
		if errs[i] != nil {
			continue
		}
		if verdicts[i], errs[i] = netpolicy.JudgePacket(nil, maps, q); errs[i] == nil {
			valid = append(valid, i)
		}
	}
	if len(valid) == 0 {
		return verdicts, errs, "", nil
	}
	var results []policybpf.PolicyResult
	var names []string
	program = "agent"
	if agentRoot != "" && filepath.Clean(agentRoot) == filepath.Clean(root) {
		results, names, err = agentVerdicts(o, queries, valid)
	}
	if results == nil && (agentRoot == "" || errors.Is(err, errNoAgentProgram) || err == nil) {
		program = "loaded"
		results, err = loadedVerdicts(root, maps, queries, valid)
	}
	if err != nil {
		return nil, nil, "", err
	}
	for j, i := range valid {
		model := verdicts[i].Result
		verdicts[i].Result = results[j]
		if names != nil {
			verdicts[i].Object = names[j]
		}
		// The mode is the program's: the default step is the kernel's.
		// An audited packet passes, which the maps deny.
		if r := results[j]; r.Step != policybpf.StepDefault && ((r.Allow && !r.Audited) != model.Allow || r.Step != model.Step || r.Interval != model.Interval) {
			errs[i] = fmt.Errorf("%s: the program says %+v, the pod's longest matching keys say %+v: the maps changed during the run?",
				queries[i], r, model)
		}
	}
	return verdicts, errs, program, nil
}

// errNoAgentProgram: the agent has no verdict API (an older agent) or no
// program to run; the program is loaded here instead.
var errNoAgentProgram = errors.New("the agent runs no verdict program")

func agentVerdicts(o *options, queries []netpolicy.VerdictQuery, valid []int) ([]policybpf.PolicyResult, []string, error) {
	req := enforce.VerdictRequest{Queries: make([]enforce.VerdictQuery, len(valid))}
	for j, i := range valid {
		q := queries[i]
		req.Queries[j] = enforce.VerdictQuery{Direction: q.Direction.String(), Pod: q.Pod, Peer: q.Peer, Protocol: q.Protocol, Port: q.Port}
	}
	var answer enforce.VerdictAnswer
	code, err := agentapi.NewClient(o.socket(), time.Minute).Do(http.MethodPost, enforce.VerdictPath, req, &answer)
	var notRunning *agentapi.NotRunningError
	switch {
	case errors.As(err, &notRunning), code == http.StatusNotFound, code == http.StatusMethodNotAllowed, code == http.StatusServiceUnavailable:
		return nil, nil, fmt.Errorf("%w: %v", errNoAgentProgram, err)
	case err != nil:
		return nil, nil, err
	case len(answer.Results) != len(valid):
		return nil, nil, fmt.Errorf("the agent answered %d verdicts to %d queries", len(answer.Results), len(valid))
	}
	out := make([]policybpf.PolicyResult, len(valid))
	names := make([]string, len(valid))
	for j, r := range answer.Results {
		step, err := policybpf.ParsePolicyStep(r.Step)
		if err != nil {
			return nil, nil, fmt.Errorf("the agent's verdict %d: %w", j, err)
		}
		out[j] = policybpf.PolicyResult{Allow: r.Allow, Audited: r.Audited, Reason: r.Reason, Step: step, Interval: r.Interval}
		names[j] = r.Object
	}
	return out, names, nil
}

// loadedVerdicts loads the verdict program on the pinned maps (through the
// verifier) and runs it on the queries.
func loadedVerdicts(root string, readOnly map[string]*ebpf.Map, queries []netpolicy.VerdictQuery, valid []int) ([]policybpf.PolicyResult, error) {
	maps, err := openPolicyMaps(root, false)
	if err != nil {
		return nil, err
	}
	defer closeMaps(maps)
	// The node's enforcing mode, so that the verdict is the kernel's; the
	// tracked connections are not used: a verdict is the policy's for a
	// new connection.
	withMode := stdmaps.Clone(maps)
	mode := filepath.Join(bpf.GlobalsDir(root), policybpf.PolicyModeMapName)
	if m, err := ebpf.LoadPinnedMap(mode, &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
		defer m.Close()
		withMode[policybpf.PolicyModeMapName] = m
	}
	prog, err := policybpf.LoadPolicyProgram(withMode)
	if err != nil {
		return nil, err
	}
	defer prog.Close()
	out := make([]policybpf.PolicyResult, len(valid))
	for j, i := range valid {
		v, err := netpolicy.JudgePacket(prog, readOnly, queries[i])
		if err != nil {
			return nil, err
		}
		out[j] = v.Result
	}
	return out, nil
}
