package test

import (
	"encoding/json"
	"fmt"
	"strings"
)

// checkObjects checks the agent's tables: no PolicyEndpoint or
// ClusterPolicyEndpoint refused (Error column empty), health naming
// nothing invalid, and every ClusterPolicyEndpoint's warning naming
// spec.subject, the field the controller writes and the decoder does not
// know, in its row and the agent's log. Each check fails once, naming
// every object it concerns.
func (e *awsEnv) checkObjects(what string) {
	t := e.t
	t.Helper()
	var refused []string
	for _, table := range []string{"policy-endpoints", "cluster-policy-endpoints"} {
		rows, err := e.showColumns(table, "Name", "Error")
		if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		for _, r := range rows {
			if r[1] != "" {
				refused = append(refused, fmt.Sprintf("%s %s: %s", table, r[0], r[1]))
			}
		}
	}
	if len(refused) > 0 {
		t.Errorf("%s: %d objects refused (their Error column):\n\t%s", what, len(refused), strings.Join(refused, "\n\t"))
	}
	if _, body, err := e.agent.Get("/healthz"); err != nil {
		t.Errorf("%s: /healthz: %v", what, err)
	} else if strings.Contains(strings.ToLower(string(body)), "invalid") {
		var rep struct {
			Modules []struct {
				Degraded []struct{ Scope, Message string }
			}
		}
		var msgs []string
		if err := json.Unmarshal(body, &rep); err != nil {
			msgs = append(msgs, string(body))
		}
		for _, m := range rep.Modules {
			for _, d := range m.Degraded {
				msg := d.Message
				if len(msg) > 300 {
					msg = msg[:300] + "..."
				}
				msgs = append(msgs, d.Scope+": "+msg)
			}
		}
		t.Errorf("%s: health names something invalid:\n\t%s", what, strings.Join(msgs, "\n\t"))
	}
	rows, err := e.showColumns("cluster-policy-endpoints", "Name", "Warnings")
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	if len(rows) == 0 {
		t.Errorf("%s: no ClusterPolicyEndpoint in the agent's table", what)
	}
	var unnamed []string
	for _, r := range rows {
		if !strings.Contains(r[1], "subject") {
			unnamed = append(unnamed, fmt.Sprintf("%s (%q)", r[0], r[1]))
		}
	}
	if len(unnamed) > 0 {
		t.Errorf("%s: %d of %d ClusterPolicyEndpoints' warnings do not name spec.subject (the field the decoder does not know): %s",
			what, len(unnamed), len(rows), strings.Join(unnamed, ", "))
	}
	if !strings.Contains(e.agent.Log(), "subject") {
		t.Errorf("%s: the agent's log does not name spec.subject", what)
	}
}

// showColumns is `db/show --columns=...` of a table, one row a slice: the
// first column is a name (no spaces), the last takes the rest of the line.
func (e *awsEnv) showColumns(table string, columns ...string) ([][]string, error) {
	out, errOut, err := e.agent.Dbg("shell", "--", "db/show", "--columns="+strings.Join(columns, ","), table)
	if err != nil {
		return nil, fmt.Errorf("db/show %s: %v\n%s%s", table, err, out, errOut)
	}
	var rows [][]string
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 || !strings.HasPrefix(strings.TrimSpace(lines[0]), columns[0]) {
		return nil, fmt.Errorf("db/show %s: no header in\n%s", table, out)
	}
	for _, line := range lines[1:] {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		row := []string{fields[0], strings.Join(fields[1:], " ")}
		rows = append(rows, row)
	}
	return rows, nil
}
