// monitoring runs etcd's own monitoring mixin (its alert rules and its dashboard's queries,
// rendered by run.sh from etcd's published module) against three-member clusters of etcd
// 3.7.3 and of cairn under a real Prometheus, drives each alert's condition, and reports, per
// target, which alerts fired, which dashboard queries returned data and whether `etcdctl
// check perf` and `check datascale` passed. It fails when cairn misses what etcd does, and
// when etcd itself misses something the harness drives (then the harness is wrong).
//
// Usage: see run.sh, which renders the mixin and passes the paths.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

type config struct {
	rules, dashboard, workdir, results string
	etcd, cairn, etcdctl               string
	prometheus, promtool               string
	targets                            []string
	peerDelay                          time.Duration
	ownDisks                           bool
	accept                             map[string]bool // alert names cairn may miss
	strictPerf                         bool
}

// timed are the alerts on a latency percentile. On the healthy cluster they are reported, not
// judged: on two shared cores one slow fsync or request among a hundred in the window crosses
// their thresholds (docs STYLE: no timed assertions on this machine). Driven, each is pushed
// far past its threshold (a 500 ms round trip against 150 ms, a 3 s fsync against 1 s).
var timed = map[string]bool{
	"etcdGRPCRequestsSlow":        true,
	"etcdMemberCommunicationSlow": true,
	"etcdHighFsyncDurations":      true,
	"etcdHighCommitDurations":     true,
}

func main() {
	var cfg config
	var targets string
	flag.StringVar(&cfg.rules, "rules", "", "the mixin's prometheusAlerts rendered as JSON")
	flag.StringVar(&cfg.dashboard, "dashboard", "", "the mixin's grafanaDashboards rendered as JSON")
	flag.StringVar(&cfg.workdir, "workdir", "/tmp/cairn-monitoring", "data, logs and Prometheus of each target")
	flag.StringVar(&cfg.results, "results", "", "also write the report (markdown) here")
	flag.StringVar(&cfg.etcd, "etcd", "target/etcd-3.7/etcd", "etcd 3.7.3 binary")
	flag.StringVar(&cfg.cairn, "cairn", "target/debug/cairn", "cairn binary")
	flag.StringVar(&cfg.etcdctl, "etcdctl", "target/etcd-3.7/etcdctl", "etcdctl for the checks")
	flag.StringVar(&cfg.prometheus, "prometheus", "prometheus", "Prometheus binary")
	flag.StringVar(&cfg.promtool, "promtool", "promtool", "promtool binary")
	flag.StringVar(&targets, "targets", "etcd,cairn", "targets to run, in order")
	flag.DurationVar(&cfg.peerDelay, "peer-delay", 250*time.Millisecond, "delay each way on a slow peer link")
	cfg.accept = map[string]bool{}
	flag.Func("accept", "an alert name cairn may leave unfired where etcd fires it, a difference documented elsewhere (repeatable)",
		func(name string) error { cfg.accept[name] = true; return nil })
	flag.BoolVar(&cfg.strictPerf, "strict-perf", false,
		"fail when check perf fails on cairn and passes on etcd (its 0.5 s bound on the slowest request is timed)")
	flag.Parse()
	cfg.targets = strings.Split(targets, ",")
	if cfg.rules == "" || cfg.dashboard == "" {
		fmt.Fprintln(os.Stderr, "usage: monitoring --rules rules.json --dashboard dashboards.json [flags]")
		os.Exit(2)
	}
	if err := os.MkdirAll(cfg.workdir, 0o755); err != nil {
		fatal(err)
	}
	cfg.ownDisks = os.Geteuid() == 0
	for _, tool := range []string{"fsfreeze", "mkfs.ext4", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			cfg.ownDisks = false
		}
	}
	if !cfg.ownDisks {
		fmt.Println("not root or no fsfreeze/mkfs.ext4: the slow-disk alerts are not driven")
	}

	shortPath := filepath.Join(cfg.workdir, "rules.json")
	orig, short, err := loadRules(cfg.rules, shortPath)
	if err != nil {
		fatal(err)
	}
	if out, err := exec.Command(cfg.promtool, "check", "rules", shortPath).CombinedOutput(); err != nil {
		fatal(fmt.Errorf("promtool check rules %s: %v\n%s", shortPath, err, out))
	}
	queries, err := loadDashboard(cfg.dashboard)
	if err != nil {
		fatal(err)
	}
	fmt.Printf("%d alert rules (shortened: %s), %d dashboard queries\n", len(short), shortPath, len(queries))

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	var results []*targetResult
	for _, t := range cfg.targets {
		var bin, label string
		switch t {
		case "etcd":
			bin, label = cfg.etcd, "etcd"
		case "cairn":
			bin, label = cfg.cairn, "cairn"
		default:
			fatal(fmt.Errorf("unknown target %q", t))
		}
		if abs, err := filepath.Abs(bin); err == nil {
			bin = abs
		}
		results = append(results, runTarget(ctx, cfg, label, bin, short, queries, shortPath))
		if ctx.Err() != nil {
			fatal(ctx.Err())
		}
	}
	text, failures := report(orig, short, queries, results, cfg)
	fmt.Println()
	fmt.Print(text)
	if cfg.results != "" {
		if err := os.WriteFile(cfg.results, []byte(text), 0o644); err != nil {
			fatal(err)
		}
	}
	if len(failures) > 0 {
		fmt.Printf("\nFAIL (%d):\n", len(failures))
		for _, f := range failures {
			fmt.Println("  " + f)
		}
		os.Exit(1)
	}
	if len(results) == 2 {
		fmt.Println("\nPASS: cairn fires every alert and answers every dashboard query that etcd 3.7.3 does")
	} else {
		fmt.Println("\nPASS (one target: nothing to compare; etcd's own misses are still checked)")
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "monitoring:", err)
	os.Exit(1)
}

// report renders the tables and lists what fails: cairn missing what etcd has, and etcd
// missing what the harness drives.
func report(orig, short []alertRule, queries []dashQuery, results []*targetResult, cfg config) (string, []string) {
	var b strings.Builder
	var failures []string
	var etcd, cairn *targetResult
	for _, r := range results {
		switch r.label {
		case "etcd":
			etcd = r
		case "cairn":
			cairn = r
		}
		if r.err != nil {
			failures = append(failures, fmt.Sprintf("%s: run failed: %v", r.label, r.err))
		}
	}
	head, sep := "", ""
	for _, r := range results {
		head += fmt.Sprintf(" %s |", r.version)
		sep += " --- |"
	}

	// Alerts.
	fmt.Fprintf(&b, "### Alerts\n\n| alert (severity) | for, in the mixin | driven by |%s\n| --- | --- | --- |%s\n", head, sep)
	firedOK := func(r *targetResult, a alertRule) (bool, bool) { // (driven, fired in a driving phase)
		d, ok := drivers[a.Name]
		if !ok || (d.disk && !r.ownDisks) {
			return false, false
		}
		for _, p := range r.fired[a.key()] {
			if p == d.phase {
				return true, true
			}
		}
		return true, false
	}
	for i, a := range short {
		d, ok := drivers[a.Name]
		how := "not driven"
		if ok {
			how = d.how
		}
		fmt.Fprintf(&b, "| %s | %s | %s |", a.key(), orig[i].For, how)
		for _, r := range results {
			if r.err != nil && r.fired == nil {
				b.WriteString(" run failed |")
				continue
			}
			driven, fired := firedOK(r, a)
			cell := ""
			switch {
			case fired:
				cell = "fired"
			case driven && r.label == "cairn" && cfg.accept[a.Name]:
				cell = "not fired (accepted with --accept)"
			case driven:
				cell = "**not fired**"
			case d.disk && !r.ownDisks:
				cell = "skipped (needs root)"
			default:
				cell = "not driven"
			}
			if errText := r.ruleErrors[a.key()]; errText != "" {
				cell += " (rule error: " + errText + ")"
			}
			fmt.Fprintf(&b, " %s |", cell)
		}
		b.WriteString("\n")
		if etcd != nil && etcd.fired != nil {
			eDriven, eFired := firedOK(etcd, a)
			if eDriven && !eFired {
				failures = append(failures, fmt.Sprintf("harness check: etcd did not fire %s (%s)", a.key(), d.how))
			}
			if cairn != nil && cairn.fired != nil && eFired {
				if _, cFired := firedOK(cairn, a); !cFired && !cfg.accept[a.Name] {
					failures = append(failures, fmt.Sprintf("cairn did not fire %s (%s)%s", a.key(), d.how, missingMetrics(cairn, a.Expr)))
				}
			}
		}
	}
	var termNames []string
	for _, r := range results {
		for n := range r.terms {
			if !contains(termNames, n) {
				termNames = append(termNames, n)
			}
		}
	}
	sort.Strings(termNames)
	for _, n := range termNames {
		fmt.Fprintf(&b, "| %s | | a follower SIGKILLed |", n)
		for _, r := range results {
			held, ok := r.terms[n]
			switch {
			case !ok:
				b.WriteString(" not run |")
			case held:
				b.WriteString(" held |")
			default:
				b.WriteString(" **did not hold** |")
			}
		}
		b.WriteString("\n")
		if etcd != nil && etcd.terms != nil {
			if held, ok := etcd.terms[n]; ok && !held {
				failures = append(failures, "harness check: on etcd, "+n+" did not hold")
			} else if ok && cairn != nil {
				if held, ok := cairn.terms[n]; ok && !held {
					expr := ""
					for _, a := range short {
						if strings.HasPrefix(n, a.Name+":") {
							expr = a.Expr
						}
					}
					failures = append(failures, "on cairn, "+n+" did not hold"+missingMetrics(cairn, expr))
				}
			}
		}
	}
	b.WriteString("| firing on the healthy cluster (latency alerts reported, not judged) | | |")
	for _, r := range results {
		q := quietFiring(r)
		if len(q) == 0 {
			b.WriteString(" none |")
		} else {
			fmt.Fprintf(&b, " **%s** |", strings.Join(q, ", "))
		}
	}
	b.WriteString("\n")
	untimed := func(k string) bool { return !timed[strings.SplitN(k, " (", 2)[0]] }
	if etcd != nil {
		for _, k := range quietFiring(etcd) {
			if untimed(k) {
				failures = append(failures, "harness check: etcd fired "+k+" on the healthy cluster")
			}
		}
	}
	if cairn != nil && etcd != nil {
		quietEtcd := map[string]bool{}
		for _, k := range quietFiring(etcd) {
			quietEtcd[k] = true
		}
		for _, k := range quietFiring(cairn) {
			if !quietEtcd[k] && untimed(k) {
				failures = append(failures, "cairn fired "+k+" on the healthy cluster")
			}
		}
	}

	// Dashboard.
	fmt.Fprintf(&b, "\n### Dashboard queries (a number at some point of the run; `$__rate_interval` = %s)\n\n| panel | query |%s\n| --- | --- |%s\n",
		dashboardVars["$__rate_interval"], head, sep)
	for i, q := range queries {
		fmt.Fprintf(&b, "| %s | `%s` |", q.Panel, strings.ReplaceAll(q.Expr, "|", `\|`))
		for _, r := range results {
			if r.data == nil {
				b.WriteString(" run failed |")
				continue
			}
			if r.data[i] {
				b.WriteString(" data |")
			} else {
				b.WriteString(" **no data** |")
			}
		}
		b.WriteString("\n")
		if etcd != nil && etcd.data != nil {
			if !etcd.data[i] {
				failures = append(failures, fmt.Sprintf("harness check: etcd had no data for %q: %s", q.Panel, q.Expr))
			} else if cairn != nil && cairn.data != nil && !cairn.data[i] {
				failures = append(failures, fmt.Sprintf("cairn had no data for %q: %s%s", q.Panel, q.Expr, missingMetrics(cairn, q.Expr)))
			}
		}
	}

	// etcdctl checks.
	perfNote := "perf reported, not judged: its bounds are timed; --strict-perf judges it"
	if cfg.strictPerf {
		perfNote = "perf judged (--strict-perf)"
	}
	fmt.Fprintf(&b, "\n### etcdctl check (etcdctl 3.7.3, --load=s --auto-compact --auto-defrag; %s)\n\n| check |%s\n| --- |%s\n", perfNote, head, sep)
	for _, kind := range []string{"perf", "datascale"} {
		fmt.Fprintf(&b, "| %s |", kind)
		for _, r := range results {
			c, ok := r.checks[kind]
			switch {
			case !ok:
				b.WriteString(" not run |")
			case c.pass:
				fmt.Fprintf(&b, " pass: %s |", c.summary)
			default:
				fmt.Fprintf(&b, " **fail**: %s |", c.summary)
			}
		}
		b.WriteString("\n")
		if etcd != nil && (kind != "perf" || cfg.strictPerf) {
			ec, eok := etcd.checks[kind]
			if eok && !ec.pass && kind != "perf" {
				failures = append(failures, "harness check: etcdctl check "+kind+" failed on etcd: "+ec.summary)
			}
			if cairn != nil {
				if cc, ok := cairn.checks[kind]; eok && ec.pass && ok && !cc.pass {
					failures = append(failures, "etcdctl check "+kind+" failed on cairn: "+cc.summary)
				}
			}
		}
	}

	// Metrics the mixin uses that a target never exposed.
	used := map[string]bool{}
	for _, a := range short {
		for _, m := range metricsOf(a.Expr) {
			used[m] = true
		}
	}
	for _, q := range queries {
		for _, m := range metricsOf(q.Expr) {
			used[m] = true
		}
	}
	delete(used, "up") // Prometheus's own
	b.WriteString("\n### Metrics the mixin uses that a target never exposed\n\n")
	for _, r := range results {
		if r.metrics == nil {
			continue
		}
		var missing []string
		for m := range used {
			if !r.metrics[m] {
				missing = append(missing, m)
			}
		}
		sort.Strings(missing)
		if len(missing) == 0 {
			missing = []string{"none"}
		}
		fmt.Fprintf(&b, "- %s: %s\n", r.version, strings.Join(missing, ", "))
	}

	for _, r := range results {
		for i, q := range queries {
			if e, ok := r.queryErrors[q.Expr]; ok && r.data != nil && !r.data[i] {
				fmt.Fprintf(&b, "- %s: `%s` failed: %s\n", r.version, q.Expr, e)
			}
		}
	}

	b.WriteString("\n### How each target answered the driven requests\n\n")
	for _, r := range results {
		for _, n := range r.notes {
			fmt.Fprintf(&b, "- %s: %s\n", r.version, n)
		}
	}
	return b.String(), failures
}

func quietFiring(r *targetResult) []string {
	var out []string
	for k, ps := range r.fired {
		for _, p := range ps {
			if p == phaseHealthy {
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

func missingMetrics(r *targetResult, expr string) string {
	if r.metrics == nil {
		return ""
	}
	var missing []string
	for _, m := range metricsOf(expr) {
		if m != "up" && !r.metrics[m] {
			missing = append(missing, m)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return "; never exposed: " + strings.Join(missing, ", ")
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
