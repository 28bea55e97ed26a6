package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/enimasq/enimasq/bpf/policybpf"
	"github.com/enimasq/enimasq/cells/agentapi"
	"github.com/enimasq/enimasq/policymap/netpolicy/enforce"
)

// policyEventsCommand is `policy events [--follow=false] [-o json|yaml]`:
// the packets the policy programs denied, from the agent
// (GET /v1/policy/events).
func policyEventsCommand(o *options) *cobra.Command {
	var follow bool
	var format string
	cmd := &cobra.Command{
		Use:   "events [--follow=false]",
		Short: "Print the packets the policy programs deny, as they come (the agent runs with --policy-event-logs)",
		Long: "Prints the last " + strconv.Itoa(enforce.EventsKept) + " packets the policy programs on the pods' devices denied, then each new one\n" +
			"as it comes, until interrupted; --follow=false prints those kept and exits. One line a\n" +
			"packet:\n\n" +
			"  TIME DIRECTION POD PEER PROTOCOL/PORT STEP OBJECT REASON\n\n" +
			"PORT is the destination port; STEP the step that decided (admin, namespace, baseline,\n" +
			"default, or none for a drop before the policy: spoofed, malformed, a fragment); OBJECT\n" +
			"the deciding object (ClusterPolicyEndpoint/NAME, the PolicyEndpoints that isolate the\n" +
			"pod, #ID when the agent cannot name it, - for none). -o json prints one object a line,\n" +
			"-o yaml one document each.\n\n" +
			"The agent reports them only when it runs with --policy-event-logs (it logs each one too:\n" +
			"\"Policy denied\"). Exit 2 when the agent cannot be reached.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return streamPolicyEvents(ctx, o.socket(), follow, cmd.OutOrStdout(), format)
		},
	}
	cmd.Flags().BoolVar(&follow, "follow", true, "Print each new denied packet as it comes (false: those the agent kept, then exit)")
	outputFlag(cmd, &format)
	return cmd
}

// streamPolicyEvents prints the events the agent on socket serves until
// the stream ends or ctx does (an interrupt: no error).
func streamPolicyEvents(ctx context.Context, socket string, follow bool, w io.Writer, format string) error {
	timeout, path := time.Duration(0), enforce.EventsPath
	if !follow {
		timeout, path = time.Minute, path+"?follow=false"
	}
	n, failed := 0, error(nil)
	code, err := agentapi.NewClient(socket, timeout).Stream(ctx, path, func(line []byte) error {
		var ev enforce.Event
		if failed = json.Unmarshal(line, &ev); failed != nil {
			failed = fmt.Errorf("the agent's event %q: %w", line, failed)
		} else {
			failed = printPolicyEvent(w, format, n, ev)
		}
		n++
		return failed
	})
	var apiErr *agentapi.APIError
	switch {
	case failed != nil:
		return failed
	case ctx.Err() != nil && !errors.As(err, new(*agentapi.NotRunningError)):
		return nil
	case err != nil && !errors.As(err, &apiErr) && (code == http.StatusNotFound || code == http.StatusMethodNotAllowed):
		// An agent without the events API.
		return fmt.Errorf("the agent has no policy events API (%d %s, an older agent?)", code, http.StatusText(code))
	case err != nil && code == http.StatusOK:
		return fmt.Errorf("reading the agent's events: %w", err)
	case err != nil:
		return err
	case follow:
		return errors.New("the agent ended the stream of events (is it stopping?)")
	}
	return nil
}

// printPolicyEvent prints the n-th event: a line, a JSON line, or a YAML
// document.
func printPolicyEvent(w io.Writer, format string, n int, ev enforce.Event) error {
	switch format {
	case "json":
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(ev)
		if err != nil {
			return err
		}
		if n > 0 {
			if _, err := io.WriteString(w, "---\n"); err != nil {
				return err
			}
		}
		_, err = w.Write(b)
		return err
	}
	_, err := fmt.Fprintln(w, policyEventLine(ev))
	return err
}

// policyEventLine is "TIME DIRECTION POD PEER PROTOCOL/PORT STEP OBJECT
// REASON".
func policyEventLine(ev enforce.Event) string {
	addr := func(a netip.Addr) string {
		if !a.IsValid() {
			return "-"
		}
		return a.String()
	}
	proto := policybpf.ProtocolName(uint32(ev.Protocol))
	if ev.DstPort != 0 {
		proto += "/" + strconv.Itoa(int(ev.DstPort))
	}
	if !ev.Pod.IsValid() && ev.Protocol == 0 {
		proto = "-" // not IP
	}
	object := "-"
	switch {
	case ev.Object != "":
		object = ev.Object
	case ev.ObjectID != 0:
		object = "#" + strconv.FormatUint(uint64(ev.ObjectID), 10)
	}
	reason := ev.ReasonText
	if reason == "" {
		reason = ev.Reason.String()
	}
	if ev.Audited {
		reason = "AUDIT (passed, would deny): " + reason
	}
	return fmt.Sprintf("%s %-7s %-15s %-15s %-10s %-9s %s %s",
		ev.Time.Local().Format("2006-01-02T15:04:05.000Z07:00"), ev.Direction, addr(ev.Pod), addr(ev.Peer), proto, ev.Step, object, reason)
}
