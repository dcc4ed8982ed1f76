// One target's run: a three-member cluster scraped by Prometheus, taken through phases that
// each drive some of the mixin's alerts, then the etcdctl checks. In order:
//
//	warm-up           members up and scraped; nothing judged
//	healthy           10 s of light traffic: no alert may fire
//	slow              every peer link delayed; a follower's disk stalled 3 × 2 s
//	leader moved      MoveLeader five times
//	quota full        64 KiB Puts until the backend quota refuses them, and on
//	recovered         the keys deleted, compacted, defragmented, the NOSPACE alarm disarmed
//	one member down   a follower SIGKILLed
//	two members down  the other follower SIGKILLed; Puts to the member left
//	restarted         both started again, the cluster healthy
//	check perf        etcdctl check perf --load=s
//	check datascale   etcdctl check datascale --load=s
//
// The order keeps each alert's phase clear of the one before: the failed Puts of "two members
// down" would keep etcdHighNumberOfFailedGRPCRequests firing into "quota full", and the
// growth of check datascale etcdExcessiveDatabaseGrowth.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	phaseWarmup    = "warm-up"
	phaseHealthy   = "healthy"
	phaseSlow      = "slow links, stalled disk"
	phaseLeader    = "leader moved"
	phaseQuota     = "quota full"
	phaseRecovered = "recovered"
	phaseOneDown   = "one member down"
	phaseTwoDown   = "two members down"
	phaseRestarted = "restarted"
	phasePerf      = "check perf"
	phaseDatascale = "check datascale"
)

// driver says, per alert name, what drives it and in which phase it must fire.
type driver struct {
	how   string
	phase string
	disk  bool // needs a disk to stall
}

var drivers = map[string]driver{
	"etcdMembersDown":                    {"a follower SIGKILLed", phaseOneDown, false},
	"etcdInsufficientMembers":            {"both followers SIGKILLed", phaseTwoDown, false},
	"etcdNoLeader":                       {"both followers SIGKILLed", phaseTwoDown, false},
	"etcdHighNumberOfLeaderChanges":      {"MoveLeader ×5", phaseLeader, false},
	"etcdHighNumberOfFailedGRPCRequests": {"Puts refused by the quota (NOSPACE)", phaseQuota, false},
	"etcdGRPCRequestsSlow":               {"peer links delayed", phaseSlow, false},
	"etcdMemberCommunicationSlow":        {"peer links delayed", phaseSlow, false},
	"etcdHighNumberOfFailedProposals":    {"Puts to a member with no leader", phaseTwoDown, false},
	"etcdHighFsyncDurations":             {"a follower's disk stalled 3 × 2 s", phaseSlow, true},
	"etcdHighCommitDurations":            {"a follower's disk stalled 3 × 2 s", phaseSlow, true},
	"etcdDatabaseQuotaLowSpace":          {"64 KiB Puts until NOSPACE", phaseQuota, false},
	"etcdExcessiveDatabaseGrowth":        {"64 KiB Puts until NOSPACE", phaseQuota, false},
}

type checkResult struct {
	pass    bool
	summary string
}

type targetResult struct {
	label       string
	version     string
	fired       map[string][]string
	data        []bool
	queryErrors map[string]string
	checks      map[string]checkResult
	metrics     map[string]bool
	ruleErrors  map[string]string
	rulesLoaded int
	collectErr  error
	notes       []string
	terms       map[string]bool // a term of a rule, alone, held true in its phase
	ownDisks    bool
	err         error
}

type harness struct {
	cfg     config
	label   string
	bin     string
	rules   []alertRule // as Prometheus evaluates them
	queries []dashQuery
	start   time.Time
	res     *targetResult
	rec     *recorder
	c       *cluster
}

func (h *harness) logf(format string, args ...any) {
	fmt.Printf("[%s +%3.0fs] %s\n", h.label, time.Since(h.start).Seconds(), fmt.Sprintf(format, args...))
}

func (h *harness) note(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	h.res.notes = append(h.res.notes, s)
	h.logf("%s", s)
}

// keysFor returns the keys of the rules with one of the names.
func (h *harness) keysFor(names ...string) []string {
	var out []string
	for _, r := range h.rules {
		for _, n := range names {
			if r.Name == n && (!drivers[n].disk || h.res.ownDisks) {
				out = append(out, r.key())
			}
		}
	}
	return out
}

func (h *harness) phase(name string) {
	h.rec.setPhase(name)
	h.logf("phase: %s", name)
}

// settle waits, up to 30 s, until none of the alerts a phase is to fire is firing still, so
// that the phase sees each fire anew (the recorder does not count one carried into a phase).
func (h *harness) settle(ctx context.Context, names ...string) {
	keys := h.keysFor(names...)
	start := time.Now()
	for {
		still := h.rec.firingNow(keys)
		if len(still) == 0 {
			if waited := time.Since(start); waited > time.Second {
				h.logf("waited %.0fs for alerts to resolve", waited.Seconds())
			}
			return
		}
		if time.Since(start) > 30*time.Second || ctx.Err() != nil {
			h.logf("still firing before the phase: %s", strings.Join(still, ", "))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// await waits for the alerts of a phase and notes the ones that did not fire. It does not
// wait for the ones cairn is allowed to miss (--accept); they are still recorded.
func (h *harness) await(ctx context.Context, timeout time.Duration, names ...string) {
	var want []string
	for _, n := range names {
		if h.label != "cairn" || !h.cfg.accept[n] {
			want = append(want, n)
		}
	}
	keys := h.keysFor(want...)
	missing := h.rec.waitFired(ctx, keys, timeout)
	var fired []string
	h.rec.mu.Lock()
	phase := h.rec.phase
	h.rec.mu.Unlock()
	for _, k := range keys {
		if !contains(missing, k) {
			fired = append(fired, fmt.Sprintf("%s after %.0fs", k, h.rec.firedAfter(k, phase).Seconds()))
		}
	}
	if len(fired) > 0 {
		h.logf("fired: %s", strings.Join(fired, ", "))
	}
	if len(missing) > 0 {
		h.logf("not fired within %.0fs: %s", timeout.Seconds(), strings.Join(missing, ", "))
	}
}

func runTarget(ctx context.Context, cfg config, label, bin string, rules []alertRule, queries []dashQuery, rulesPath string) *targetResult {
	h := &harness{cfg: cfg, label: label, bin: bin, rules: rules, queries: queries, start: time.Now()}
	h.res = &targetResult{label: label, checks: map[string]checkResult{}, terms: map[string]bool{}}
	h.res.version = label
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		// "etcd Version: 3.7.3" or "cairn 0.1.0"
		first := strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
		h.res.version = strings.Replace(first, " Version:", "", 1)
	}
	h.res.err = h.run(ctx, rulesPath)
	if h.res.err != nil {
		h.logf("ERROR: %v", h.res.err)
	}
	return h.res
}

func (h *harness) run(ctx context.Context, rulesPath string) error {
	dir := filepath.Join(h.cfg.workdir, strings.ReplaceAll(h.label, " ", "-"))
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ports, err := freePorts(10)
	if err != nil {
		return err
	}
	h.res.ownDisks = h.cfg.ownDisks
	c, err := newCluster(h.bin, dir, ports[:9], h.cfg.ownDisks)
	h.c = c
	defer c.close()
	if err != nil {
		return err
	}
	for _, m := range c.members {
		if err := c.start(m); err != nil {
			return err
		}
	}
	if _, err := c.waitHealthy(ctx, 60*time.Second); err != nil {
		return fmt.Errorf("%w (logs in %s)", err, dir)
	}
	var targets []string
	for _, m := range c.members {
		targets = append(targets, strings.TrimPrefix(m.clientURL, "http://"))
	}
	prom, err := startPrometheus(h.cfg.prometheus, filepath.Join(dir, "prometheus"), ports[9], targets, rulesPath)
	if err != nil {
		return err
	}
	defer prom.stop()
	h.rec = newRecorder(prom, h.queries)
	recCtx, stopRec := context.WithCancel(ctx)
	recDone := make(chan struct{})
	go func() { h.rec.run(recCtx); close(recDone) }()
	// What was recorded is kept however the run ends; Prometheus is still up here (deferred
	// before), so the rules' errors and the metric names are asked for too.
	var once sync.Once
	collect := func() {
		once.Do(func() {
			stopRec()
			<-recDone
			h.res.fired = h.rec.fired
			h.res.data = h.rec.dataSeen()
			h.res.queryErrors = h.rec.errors
			h.res.ruleErrors, h.res.rulesLoaded, h.res.collectErr = prom.ruleErrors()
			if h.res.collectErr == nil {
				h.res.metrics, h.res.collectErr = prom.metricNames()
			}
		})
	}
	defer collect()

	h.phase(phaseWarmup)
	stopStreams := h.openStreams(ctx)
	defer stopStreams()
	if err := h.waitScraped(ctx, 30*time.Second); err != nil {
		return err
	}
	time.Sleep(5 * time.Second) // let the 4 s windows forget the start

	steps := []func(context.Context) error{h.healthy, h.slow, h.leaderChanges, h.quota, h.recover, h.membersDown}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	h.phase(phasePerf)
	h.res.checks["perf"] = h.etcdctlCheck(ctx, dir, "perf")
	h.phase(phaseDatascale)
	h.res.checks["datascale"] = h.etcdctlCheck(ctx, dir, "datascale")
	time.Sleep(2 * time.Second) // a last scrape and evaluation
	collect()
	if h.res.collectErr != nil {
		return h.res.collectErr
	}
	if h.res.rulesLoaded != len(h.rules) {
		return fmt.Errorf("prometheus loaded %d rules, the mixin has %d", h.res.rulesLoaded, len(h.rules))
	}
	return nil
}

// waitScraped waits until Prometheus has scraped all three members.
func (h *harness) waitScraped(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	q := fmt.Sprintf(`count(up{job=%q} == 1) == 3`, jobName)
	for {
		ss, err := h.rec.prom.query(q)
		if err == nil && len(ss) == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("prometheus did not scrape all three members within %s (last: %v)", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// openStreams keeps a watch and a lease keep-alive open for the whole run, as a real client
// does (the dashboard's Active Streams panel), and opens and ends one of each, so that both
// started and handled counters of the streaming methods exist.
func (h *harness) openStreams(ctx context.Context) func() {
	ctx, cancel := context.WithCancel(ctx)
	cli := h.c.members[0].cli
	wch := cli.Watch(ctx, "/monitoring/watched/", clientv3.WithPrefix())
	go func() {
		for range wch {
		}
	}()
	go func() {
		lease, err := cli.Grant(ctx, 60)
		if err != nil {
			h.logf("lease grant: %v", err)
			return
		}
		kch, err := cli.KeepAlive(ctx, lease.ID)
		if err != nil {
			h.logf("lease keep-alive: %v", err)
			return
		}
		for range kch {
		}
	}()
	go func() {
		short, err := clientv3.New(clientv3.Config{Endpoints: []string{h.c.members[1].clientURL}, DialTimeout: 2 * time.Second, Logger: cli.GetLogger()})
		if err != nil {
			return
		}
		defer short.Close()
		w := short.Watch(ctx, "/monitoring/watched/", clientv3.WithPrefix())
		if lease, err := short.Grant(ctx, 10); err == nil {
			short.KeepAlive(ctx, lease.ID)
		}
		short.Put(ctx, "/monitoring/watched/a", "1")
		select {
		case <-w:
		case <-time.After(3 * time.Second):
		}
		time.Sleep(2 * time.Second)
	}()
	return cancel
}

func (h *harness) etcdctlCheck(ctx context.Context, dir, kind string) checkResult {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.cfg.etcdctl, "--endpoints="+h.c.endpoints(), "check", kind,
		"--load=s", "--auto-compact", "--auto-defrag")
	out, err := cmd.CombinedOutput()
	os.WriteFile(filepath.Join(dir, "check-"+kind+".txt"), out, 0o644)
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSpace(l[strings.LastIndex(l, "\r")+1:])
		if checkLine.MatchString(l) {
			lines = append(lines, l)
		}
	}
	r := checkResult{pass: err == nil, summary: strings.Join(lines, "; ")}
	if err != nil && r.summary == "" {
		r.summary = err.Error()
	}
	h.logf("etcdctl check %s: pass=%v %s", kind, r.pass, r.summary)
	return r
}

// checkLine matches what etcdctl check prints as its verdict: "PASS: Throughput is 150
// writes/s", "Slowest request took too long: 0.6s", "FAIL", "Error: …".
var checkLine = regexp.MustCompile(`^(PASS|FAIL|Error|Throughput|Slowest|Stddev|Could not)`)

func put(cli *clientv3.Client, timeout time.Duration, key, val string) func(context.Context, int, int) error {
	return func(ctx context.Context, w, n int) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := cli.Put(ctx, fmt.Sprintf("%s/%d/%d", key, w, n), val)
		return err
	}
}

// checkTerm evaluates one term of a rule on its own, the parenthesised expression that starts
// with prefix, until it holds or the timeout: etcdMembersDown fires on `up` alone, and this
// checks its other half, the peers' failed sends to the member that is gone.
func (h *harness) checkTerm(ctx context.Context, alert, prefix string, timeout time.Duration) {
	var expr string
	for _, r := range h.rules {
		if r.Name == alert {
			expr = termOf(r.Expr, prefix)
		}
	}
	if expr == "" {
		h.logf("no term %q in %s", prefix, alert)
		return
	}
	name := fmt.Sprintf("%s: `%s …` alone", alert, prefix)
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(time.Second) {
		if ss, err := h.rec.prom.query(expr); err == nil && hasData(ss) {
			h.res.terms[name] = true
			h.logf("holds: %s", name)
			return
		}
	}
	h.res.terms[name] = false
	h.logf("did not hold within %s: %s", timeout, name)
}

// healthy is light traffic on a healthy cluster, the baseline: no alert may fire.
func (h *harness) healthy(ctx context.Context) error {
	h.phase(phaseHealthy)
	l := startLoad(ctx, 2, 200*time.Millisecond, func(ctx context.Context, w, n int) error {
		m := h.c.members[(w+n)%3]
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := m.cli.Put(ctx, fmt.Sprintf("/monitoring/healthy/%d", n%50), "v"); err != nil {
			return err
		}
		_, err := m.cli.Get(ctx, "/monitoring/healthy/", clientv3.WithPrefix())
		return err
	})
	time.Sleep(10 * time.Second)
	h.note("healthy: Puts and Gets: %s", l.stop())
	return nil
}

// slow delays every peer link, which makes each write wait 2 × delay for its quorum and each
// RTT probe take as long, and meanwhile stalls a follower's disk three times for 2 s, so that
// WAL fsyncs and backend commits on it take up to that long. Writes are one a second: slow
// fsyncs must be more than 1 % of those in the window for the 99th percentile to see them.
func (h *harness) slow(ctx context.Context) error {
	slowAlerts := []string{"etcdMemberCommunicationSlow", "etcdGRPCRequestsSlow", "etcdHighFsyncDurations", "etcdHighCommitDurations"}
	h.settle(ctx, slowAlerts...)
	h.phase(phaseSlow)
	start := time.Now()
	leader, err := h.c.leader(ctx)
	if err != nil {
		return err
	}
	h.c.setDelay(h.cfg.peerDelay)
	w := startLoad(ctx, 1, time.Second, put(leader.cli, 10*time.Second, "/monitoring/slow", "v"))
	if h.res.ownDisks {
		time.Sleep(5 * time.Second)
		f := h.c.followers(leader)[0]
		h.logf("stalling %s's disk", f.name)
		stalled := time.Now()
		if err := f.stallDisk(ctx, 3, 2*time.Second, 500*time.Millisecond); err != nil {
			return err
		}
		defer h.noteStall(f, stalled, time.Now())
	}
	h.await(ctx, 55*time.Second-time.Since(start), slowAlerts...)
	h.c.setDelay(0)
	h.note("slow links: Puts to the leader: %s", w.stop())
	_, err = h.c.waitHealthy(ctx, 30*time.Second)
	return err
}

// noteStall notes what the stalled member's disk histograms saw from the stall to 3 s after
// it: how many observations, and the bucket of the slowest.
func (h *harness) noteStall(m *member, from, to time.Time) {
	at := to.Add(3 * time.Second)
	if wait := time.Until(at.Add(time.Second)); wait > 0 {
		time.Sleep(wait) // until Prometheus has scraped past it
	}
	window := fmt.Sprintf("[%ds]", int(at.Sub(from).Seconds()+1))
	inst := strings.TrimPrefix(m.clientURL, "http://")
	var parts []string
	for _, hist := range []string{"etcd_disk_wal_fsync_duration_seconds", "etcd_disk_backend_commit_duration_seconds"} {
		sel := fmt.Sprintf(`{instance=%q}%s`, inst, window)
		n, err1 := h.rec.prom.queryAt("increase("+hist+"_count"+sel+")", at)
		slowest, err2 := h.rec.prom.queryAt("histogram_quantile(1, sum by (le) (increase("+hist+"_bucket"+sel+")))", at)
		if err1 != nil || err2 != nil || len(n) == 0 || len(slowest) == 0 {
			parts = append(parts, hist+": no data")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: %.0f observed, the slowest ≤ %gs", hist, n[0].value(), slowest[0].value()))
	}
	h.note("disk of %s stalled 3 × 2 s in %.1fs; from then to 3 s after: %s", m.name, to.Sub(from).Seconds(), strings.Join(parts, "; "))
}

// leaderChanges moves the leadership five times, as `etcdctl move-leader` does.
func (h *harness) leaderChanges(ctx context.Context) error {
	h.settle(ctx, "etcdHighNumberOfLeaderChanges")
	h.phase(phaseLeader)
	for i := 0; i < 5; i++ {
		leader, err := h.c.leader(ctx)
		if err != nil {
			return err
		}
		next := h.c.followers(leader)[i%2]
		id, _, err := next.status(ctx)
		if err != nil {
			return err
		}
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = leader.cli.MoveLeader(mctx, id)
		cancel()
		if err != nil {
			h.note("move-leader %s -> %s: %v", leader.name, next.name, err)
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if l, err := h.c.leader(ctx); err == nil && l == next {
				break
			}
		}
		time.Sleep(time.Second)
	}
	h.await(ctx, 15*time.Second, "etcdHighNumberOfLeaderChanges")
	return nil
}

// membersDown kills one follower, then the other, and sends puts to the member left, which
// has no leader: each must fail (within its 1 s deadline, if the member does not answer
// first), as proposals that found no leader.
func (h *harness) membersDown(ctx context.Context) error {
	h.settle(ctx, "etcdMembersDown", "etcdInsufficientMembers", "etcdNoLeader", "etcdHighNumberOfFailedProposals")
	h.phase(phaseOneDown)
	leader, err := h.c.leader(ctx)
	if err != nil {
		return err
	}
	f := h.c.followers(leader)
	f[0].kill()
	h.await(ctx, 15*time.Second, "etcdMembersDown")
	h.checkTerm(ctx, "etcdMembersDown", "count without (To)", 10*time.Second)

	h.phase(phaseTwoDown)
	f[1].kill()
	l := startLoad(ctx, 20, 100*time.Millisecond, put(leader.cli, time.Second, "/monitoring/noleader", "v"))
	h.await(ctx, 30*time.Second, "etcdInsufficientMembers", "etcdNoLeader", "etcdHighNumberOfFailedProposals")
	h.note("no leader: Puts to %s: %s", leader.name, l.stop())

	h.phase(phaseRestarted)
	for _, m := range f {
		if err := h.c.start(m); err != nil {
			return err
		}
	}
	_, err = h.c.waitHealthy(ctx, 60*time.Second)
	return err
}

// quota writes 64 KiB values until the backend quota refuses them, and goes on writing:
// every refused Put is a failed gRPC request.
func (h *harness) quota(ctx context.Context) error {
	quotaAlerts := []string{"etcdDatabaseQuotaLowSpace", "etcdExcessiveDatabaseGrowth", "etcdHighNumberOfFailedGRPCRequests"}
	h.settle(ctx, quotaAlerts...)
	h.phase(phaseQuota)
	leader, err := h.c.leader(ctx)
	if err != nil {
		return err
	}
	val := strings.Repeat("x", 64<<10)
	l := startLoad(ctx, 4, 50*time.Millisecond, put(leader.cli, 5*time.Second, "/monitoring/quota", val))
	h.await(ctx, 40*time.Second, quotaAlerts...)
	h.note("quota: 64 KiB Puts to %s: %s", leader.name, l.stop())
	return nil
}

// recover does what etcd's maintenance guide says after NOSPACE: free space (delete,
// compact), defragment every member, disarm the alarm.
func (h *harness) recover(ctx context.Context) error {
	h.phase(phaseRecovered)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cli := h.c.members[0].cli
	del, err := cli.Delete(ctx, "/monitoring/quota/", clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("delete after NOSPACE: %w", err)
	}
	if _, err := cli.Compact(ctx, del.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("compact after NOSPACE: %w", err)
	}
	for _, m := range h.c.members {
		if _, err := cli.Defragment(ctx, m.clientURL); err != nil {
			return fmt.Errorf("defragment %s: %w", m.name, err)
		}
	}
	alarms, err := cli.AlarmList(ctx)
	if err != nil {
		return err
	}
	for _, a := range alarms.Alarms {
		if _, err := cli.AlarmDisarm(ctx, (*clientv3.AlarmMember)(a)); err != nil {
			return fmt.Errorf("disarm %v: %w", a, err)
		}
	}
	h.logf("deleted %d keys, compacted, defragmented, disarmed %d alarm(s)", del.Deleted, len(alarms.Alarms))
	_, err = h.c.waitHealthy(ctx, 30*time.Second)
	return err
}
