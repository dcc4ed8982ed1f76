// What Prometheus saw during one target's run: every alert seen firing, in which phase, and
// which dashboard queries ever returned a number. A poller asks every second.
package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

type recorder struct {
	prom    *prometheus
	queries []dashQuery

	mu    sync.Mutex
	phase string
	since time.Time                // when phase began
	fired map[string][]string      // alert key -> phases it was seen firing in, in order
	after map[string]time.Duration // alert key + phase -> how long into the phase it was first seen
	// current holds the alerts firing at the last poll; carried, those of them that were
	// already firing when the phase began and have not resolved since. An alert counts as
	// fired in a phase only if it fires anew there.
	current, carried map[string]bool
	data             []bool            // per dashboard query: a number seen at least once
	errors           map[string]string // first API error per query, for the report
}

func newRecorder(p *prometheus, queries []dashQuery) *recorder {
	return &recorder{
		prom: p, queries: queries,
		fired: map[string][]string{}, after: map[string]time.Duration{},
		current: map[string]bool{}, carried: map[string]bool{},
		data: make([]bool, len(queries)), errors: map[string]string{},
	}
}

func (r *recorder) setPhase(p string) {
	r.mu.Lock()
	r.phase = p
	r.since = time.Now()
	r.carried = map[string]bool{}
	for k := range r.current {
		r.carried[k] = true
	}
	r.mu.Unlock()
}

func (r *recorder) run(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := 0; ; n++ {
		r.pollAlerts()
		if n%3 == 0 {
			r.pollDashboard()
		}
		select {
		case <-ctx.Done():
			r.pollAlerts()
			r.pollDashboard()
			return
		case <-tick.C:
		}
	}
}

func (r *recorder) pollAlerts() {
	keys, err := r.prom.firing()
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.current = map[string]bool{}
	for _, k := range keys {
		r.current[k] = true
	}
	for k := range r.carried {
		if !r.current[k] {
			delete(r.carried, k)
		}
	}
	for _, k := range keys {
		if r.carried[k] {
			continue
		}
		ps := r.fired[k]
		if len(ps) == 0 || ps[len(ps)-1] != r.phase {
			r.fired[k] = append(ps, r.phase)
			if _, ok := r.after[k+"\x00"+r.phase]; !ok {
				r.after[k+"\x00"+r.phase] = time.Since(r.since)
			}
		}
	}
}

func (r *recorder) pollDashboard() {
	for i, q := range r.queries {
		r.mu.Lock()
		done := r.data[i]
		r.mu.Unlock()
		if done {
			continue
		}
		ss, err := r.prom.query(q.Expr)
		r.mu.Lock()
		if err != nil {
			if _, ok := r.errors[q.Expr]; !ok {
				r.errors[q.Expr] = err.Error()
			}
		} else if hasData(ss) {
			r.data[i] = true
		}
		r.mu.Unlock()
	}
}

// firedIn says whether the alert was seen firing during the phase.
func (r *recorder) firedIn(key, phase string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.fired[key] {
		if p == phase {
			return true
		}
	}
	return false
}

// waitFired waits until every alert in keys has fired in the current phase, or timeout.
// It returns the ones that did not.
func (r *recorder) waitFired(ctx context.Context, keys []string, timeout time.Duration) []string {
	r.mu.Lock()
	phase := r.phase
	r.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for {
		var missing []string
		for _, k := range keys {
			if !r.firedIn(k, phase) {
				missing = append(missing, k)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return missing
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// firingNow returns those of keys that were firing at the last poll.
func (r *recorder) firingNow(keys []string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, k := range keys {
		if r.current[k] {
			out = append(out, k)
		}
	}
	return out
}

// firedAfter says how long into the phase the alert was first seen firing.
func (r *recorder) firedAfter(key, phase string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.after[key+"\x00"+phase]
}

func (r *recorder) dataSeen() []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bool(nil), r.data...)
}

// load runs workers that each repeat op until stopped, pausing between calls, and counts the
// outcomes: how a target answered is part of the report.
type load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	ok     int
	errs   map[string]int
}

func startLoad(ctx context.Context, workers int, pause time.Duration, op func(ctx context.Context, worker, n int) error) *load {
	ctx, cancel := context.WithCancel(ctx)
	l := &load{cancel: cancel, errs: map[string]int{}}
	for w := 0; w < workers; w++ {
		l.wg.Add(1)
		go func(w int) {
			defer l.wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				err := op(ctx, w, n)
				if ctx.Err() != nil {
					return
				}
				l.mu.Lock()
				if err == nil {
					l.ok++
				} else {
					l.errs[shortErr(err)]++
				}
				l.mu.Unlock()
				select {
				case <-ctx.Done():
				case <-time.After(pause):
				}
			}
		}(w)
	}
	return l
}

func (l *load) stop() string {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	parts := []string{fmt.Sprintf("%d ok", l.ok)}
	keys := make([]string, 0, len(l.errs))
	for k := range l.errs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d × %s", l.errs[k], k))
	}
	return strings.Join(parts, ", ")
}

func shortErr(err error) string {
	s := err.Error()
	if len(s) > 90 {
		s = s[:90] + "…"
	}
	return s
}
