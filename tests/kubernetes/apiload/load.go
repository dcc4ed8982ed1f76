package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// lateAfter is how long after its scheduled time a request may be sent and
// still count as on schedule.
const lateAfter = 10 * time.Millisecond

// maxErrorSamples is how many error strings each verb keeps.
const maxErrorSamples = 5

// verbStats accumulates the samples of one verb scheduled in the measured
// window.
type verbStats struct {
	name  string
	rate  float64
	write bool

	mu         sync.Mutex
	scheduled  int
	behind     int
	maxLag     time.Duration
	latencies  []time.Duration // successful requests only
	pages      int
	conflicts  int
	errors     int
	errSamples []string
}

func (st *verbStats) record(at time.Time, s sample) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.scheduled++
	lag := s.sent.Sub(at)
	if lag > lateAfter {
		st.behind++
	}
	st.maxLag = max(st.maxLag, lag)
	switch {
	case s.err == nil:
		st.latencies = append(st.latencies, s.answered.Sub(s.sent))
		st.pages += s.pages
	case apierrors.IsConflict(s.err):
		st.conflicts++
	default:
		st.errors++
		if len(st.errSamples) < maxErrorSamples {
			st.errSamples = append(st.errSamples, s.err.Error())
		}
	}
}

// procUsage is kube-apiserver's resource use over the measured window.
type procUsage struct {
	cpuSeconds     float64
	rssEnd, rssMax int64
	err            error
}

// loadResult is everything the report needs from a run.
type loadResult struct {
	verbs        []*verbStats
	window       time.Duration
	peakInFlight int64
	usage        procUsage
}

// runner sends the load: one driver goroutine per verb keeps the schedule,
// and every request runs in its own goroutine, at most cap(slots) at once.
type runner struct {
	w                  *workload
	start, measureFrom time.Time
	end                time.Time
	slots              chan struct{}
	requests           sync.WaitGroup
	inFlight, peak     atomic.Int64
}

// runLoad runs the open-loop load for --warmup plus --seconds and returns the
// samples of the measured window, with kube-apiserver's (pid's) usage over it.
func runLoad(ctx context.Context, w *workload, o *options, pid int) (*loadResult, error) {
	var verbs []*verbStats
	for _, v := range verbNames {
		if r := *o.rates[v]; r > 0 {
			verbs = append(verbs, &verbStats{name: v, rate: r, write: writeVerbs[v]})
		}
	}
	if len(verbs) == 0 {
		return nil, errors.New("every --*-rate is 0: nothing to send")
	}
	now := time.Now()
	r := &runner{
		w:           w,
		start:       now,
		measureFrom: now.Add(seconds(o.warmup)),
		end:         now.Add(seconds(o.warmup + o.seconds)),
		slots:       make(chan struct{}, o.maxInFlight),
	}
	usage := make(chan procUsage, 1)
	go func() { usage <- watchProcess(ctx, pid, r.measureFrom, r.end) }()

	log.Printf("load: %s for %gs warm-up + %gs measured", describeRates(verbs), o.warmup, o.seconds)
	var drivers sync.WaitGroup
	for _, st := range verbs {
		drivers.Add(1)
		go func() {
			defer drivers.Done()
			r.drive(ctx, st, w.op(st.name))
		}()
	}
	progressDone := make(chan struct{})
	go r.logProgress(ctx, progressDone)
	drivers.Wait()
	close(progressDone)
	log.Printf("schedule done; waiting for %d requests in flight", r.inFlight.Load())
	r.requests.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("interrupted: %w", err)
	}
	res := &loadResult{verbs: verbs, window: r.end.Sub(r.measureFrom), peakInFlight: r.peak.Load(), usage: <-usage}
	if res.usage.err != nil {
		log.Printf("kube-apiserver CPU/RSS: %v", res.usage.err)
	}
	return res, nil
}

// drive sends the requests of one verb at its fixed rate: the i-th is due at
// start + i/rate whatever happened to the earlier ones (an open loop). A driver
// that falls behind sends the overdue requests at once.
func (r *runner) drive(ctx context.Context, st *verbStats, op func(context.Context) sample) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for i := 0; ; i++ {
		at := r.start.Add(time.Duration(float64(i) / st.rate * float64(time.Second)))
		if !at.Before(r.end) {
			return
		}
		if d := time.Until(at); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
		select {
		case <-ctx.Done():
			return
		case r.slots <- struct{}{}:
		}
		r.requests.Add(1)
		n := r.inFlight.Add(1)
		for p := r.peak.Load(); n > p && !r.peak.CompareAndSwap(p, n); p = r.peak.Load() {
		}
		go func() {
			defer func() {
				r.inFlight.Add(-1)
				<-r.slots
				r.requests.Done()
			}()
			s := op(ctx)
			if !at.Before(r.measureFrom) {
				st.record(at, s)
			}
		}()
	}
}

// logProgress logs the requests in flight (now and the most so far) every 5 s
// until done is closed.
func (r *runner) logProgress(ctx context.Context, done <-chan struct{}) {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case now := <-tick.C:
			phase := "warm-up"
			if !now.Before(r.measureFrom) {
				phase = "measured"
			}
			log.Printf("%s, %v in: %d requests in flight (peak %d)", phase, now.Sub(r.start).Round(time.Second), r.inFlight.Load(), r.peak.Load())
		}
	}
}

// watchProcess reads pid's CPU time at from and to, and its RSS every second
// in between.
func watchProcess(ctx context.Context, pid int, from, to time.Time) procUsage {
	var u procUsage
	select {
	case <-ctx.Done():
		u.err = ctx.Err()
		return u
	case <-time.After(time.Until(from)):
	}
	cpu0, _, err := readProcStat(pid)
	if err != nil {
		u.err = err
		return u
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	deadline := time.NewTimer(time.Until(to))
	defer deadline.Stop()
	for {
		select {
		case <-ctx.Done():
			u.err = ctx.Err()
			return u
		case <-tick.C:
			if _, rss, err := readProcStat(pid); err == nil {
				u.rssMax = max(u.rssMax, rss)
			}
		case <-deadline.C:
			cpu1, rss, err := readProcStat(pid)
			if err != nil {
				u.err = err
				return u
			}
			u.cpuSeconds = cpu1 - cpu0
			u.rssEnd = rss
			u.rssMax = max(u.rssMax, rss)
			return u
		}
	}
}

// userHZ is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, 100 on
// Linux whatever the kernel's tick rate).
const userHZ = 100

// readProcStat returns the CPU seconds (user + system) and resident bytes of
// process pid from /proc/<pid>/stat.
func readProcStat(pid int) (cpuSeconds float64, rssBytes int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): utime and stime are fields 14 and 15, rss 24.
	if len(f) < 22 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	rss, err3 := strconv.ParseInt(f[21], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return float64(utime+stime) / userHZ, rss * int64(os.Getpagesize()), nil
}

func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second))
}

func describeRates(verbs []*verbStats) string {
	var parts []string
	for _, st := range verbs {
		parts = append(parts, fmt.Sprintf("%s %g/s", st.name, st.rate))
	}
	return strings.Join(parts, ", ")
}
