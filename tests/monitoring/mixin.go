// etcd's monitoring mixin as run.sh rendered it with jsonnet: the alert rules, fitted to a run
// of minutes, and the dashboard's queries.
//
// The rules' logic stays etcd's: only each rule's `for` and the range windows of its
// expression are shortened (table `windows`), so that a condition held for seconds fires. An
// expression with a window the table does not know is an error, so a new mixin cannot slip
// through with an hour-long window that never fills.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// shortFor replaces every rule's `for` (1 to 20 minutes in the mixin): pending for one
// evaluation, firing at the next.
const shortFor = "2s"

// windows maps each range window of the 3.7 mixin to the harness's. Longer patterns first.
var windows = []struct{ from, to, why string }{
	{"[15m:1m]", "[60s:1s]", "etcdHighNumberOfLeaderChanges: 15 minutes at 1-minute steps"},
	{"[4h], 4*60*60)", "[60s], 60)", "etcdExcessiveDatabaseGrowth: 4 hours of history predicting 4 hours ahead"},
	{"[120s]", "[4s]", "etcdMembersDown: 4 scrape intervals, the mixin's own formula for our 1 s scrape"},
	{"[15m]", "[30s]", "etcdHighNumberOfFailedProposals"},
	{"[5m]", "[30s]", "every other rate and last_over_time"},
}

// dashboardVars are the dashboard's template variables as Grafana would fill them in for
// this Prometheus (job "etcd", scraped every second).
var dashboardVars = map[string]string{
	"$__rate_interval": "30s",
	"$cluster":         jobName,
}

const jobName = "etcd"

// alertRule is one rule of the rendered group, with the name the report uses for it: two
// rules share a name and differ in severity.
type alertRule struct {
	Name, Severity, Expr, For string
}

func (r alertRule) key() string { return r.Name + " (" + r.Severity + ")" }

type dashQuery struct {
	Panel, Expr string
}

var rangeRe = regexp.MustCompile(`\[[^\]]*\]`)

// loadRules reads the rendered prometheusAlerts (JSON), writes the shortened rule file to out
// and returns the rules as rendered and as shortened.
func loadRules(in, out string) (orig, short []alertRule, err error) {
	raw, err := os.ReadFile(in)
	if err != nil {
		return nil, nil, err
	}
	var file struct {
		Groups []struct {
			Name  string           `json:"name"`
			Rules []map[string]any `json:"rules"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", in, err)
	}
	allowed := map[string]bool{}
	for _, w := range windows {
		allowed[rangeRe.FindString(w.to)] = true
	}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			name, _ := r["alert"].(string)
			expr, _ := r["expr"].(string)
			forS, _ := r["for"].(string)
			labels, _ := r["labels"].(map[string]any)
			sev, _ := labels["severity"].(string)
			orig = append(orig, alertRule{name, sev, strings.TrimSpace(expr), forS})
			for _, w := range windows {
				expr = strings.ReplaceAll(expr, w.from, w.to)
			}
			for _, m := range rangeRe.FindAllString(expr, -1) {
				if !allowed[m] {
					return nil, nil, fmt.Errorf("rule %s: range %s is not in the harness's table of windows", name, m)
				}
			}
			r["expr"] = expr
			r["for"] = shortFor
			short = append(short, alertRule{name, sev, strings.TrimSpace(expr), shortFor})
		}
	}
	if len(orig) == 0 {
		return nil, nil, fmt.Errorf("%s: no rules", in)
	}
	seen := map[string]bool{}
	for _, r := range orig {
		if seen[r.key()] {
			return nil, nil, fmt.Errorf("two rules are both %s", r.key())
		}
		seen[r.key()] = true
	}
	b, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	return orig, short, os.WriteFile(out, b, 0o644)
}

// loadDashboard returns every target expression of every panel, variables filled in.
func loadDashboard(path string) ([]dashQuery, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []dashQuery
	var walk func(v any, title string)
	walk = func(v any, title string) {
		switch v := v.(type) {
		case map[string]any:
			if t, ok := v["title"].(string); ok {
				title = t
			}
			if e, ok := v["expr"].(string); ok && e != "" {
				out = append(out, dashQuery{Panel: title, Expr: e})
			}
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if k != "templating" { // the variables' own label_values queries are not panels
					walk(v[k], title)
				}
			}
		case []any:
			for _, e := range v {
				walk(e, title)
			}
		}
	}
	walk(doc, "")
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no panel queries", path)
	}
	for i := range out {
		for k, val := range dashboardVars {
			out[i].Expr = strings.ReplaceAll(out[i].Expr, k, val)
		}
		if strings.Contains(out[i].Expr, "$") {
			return nil, fmt.Errorf("panel %q: unknown variable in %s", out[i].Panel, out[i].Expr)
		}
	}
	return out, nil
}

var metricRe = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{`)

// metricsOf lists the metric names an expression selects (every selector in the mixin has
// braces).
func metricsOf(expr string) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range metricRe.FindAllStringSubmatch(expr, -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			out = append(out, m[1])
		}
	}
	return out
}

// termOf returns the parenthesised term of expr that starts with prefix (prefix and its
// balanced parentheses), or "" if there is none.
func termOf(expr, prefix string) string {
	i := strings.Index(expr, prefix)
	if i < 0 {
		return ""
	}
	depth := 0
	for j := i; j < len(expr); j++ {
		switch expr[j] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 && j > i+len(prefix) {
				return expr[i : j+1]
			}
		}
	}
	return ""
}
