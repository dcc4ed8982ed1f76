package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// verbReport is one verb's line of the report. Latencies are of successful
// requests, from send to answer; for list, of the whole paged list.
type verbReport struct {
	OfferedPerSec  float64  `json:"offered_per_sec"`
	Scheduled      int      `json:"scheduled"`       // requests due in the window
	Count          int      `json:"count"`           // successful answers
	PerSec         float64  `json:"per_sec"`         // Count per second of the window
	Errors         int      `json:"errors"`          // failures other than conflicts
	ErrorSamples   []string `json:"error_samples"`   // the first few
	Conflicts      int      `json:"conflicts"`       // 409 Conflict answers
	BehindSchedule int      `json:"behind_schedule"` // sent later than 10 ms after due
	P50Ms          *float64 `json:"p50_ms"`
	P90Ms          *float64 `json:"p90_ms"`
	P99Ms          *float64 `json:"p99_ms"`
	MaxMs          *float64 `json:"max_ms"`
	Pages          *int     `json:"pages,omitempty"` // list only: pages read
}

// report is the JSON object apiload prints with --json.
type report struct {
	KubeAPIServerVersion string   `json:"kube_apiserver_version"`
	EtcdServers          []string `json:"etcd_servers"`
	Seconds              float64  `json:"seconds"`
	WarmupSeconds        float64  `json:"warmup_seconds"`
	Objects              int      `json:"objects"`
	Leases               int      `json:"leases"`
	MaxInFlight          int      `json:"max_inflight"`
	PeakInFlight         int64    `json:"peak_inflight"`

	OfferedPerSec          float64 `json:"offered_per_sec"`
	Scheduled              int     `json:"scheduled"`
	BehindSchedule         int     `json:"behind_schedule"`
	BehindScheduleFraction float64 `json:"behind_schedule_fraction"`
	MaxSendLagMs           float64 `json:"max_send_lag_ms"`

	WriteCount int      `json:"write_count"` // create + update + lease
	WriteP50Ms *float64 `json:"write_p50_ms"`
	WriteP99Ms *float64 `json:"write_p99_ms"`
	ReadCount  int      `json:"read_count"` // get + list
	ReadP50Ms  *float64 `json:"read_p50_ms"`
	ReadP99Ms  *float64 `json:"read_p99_ms"`

	// kube-apiserver's user+system CPU time over the measured window, that
	// per second of it, and its RSS at the end of the window and the most
	// seen (sampled every second) in it.
	APIServerCPUSeconds  float64 `json:"apiserver_cpu_seconds"`
	APIServerCPUCores    float64 `json:"apiserver_cpu_cores"`
	APIServerRSSBytes    int64   `json:"apiserver_rss_bytes"`
	APIServerRSSMaxBytes int64   `json:"apiserver_rss_max_bytes"`

	Verbs map[string]*verbReport `json:"verbs"`

	order []string // verbs in report order, for the table
}

// buildReport computes the report of a run.
func buildReport(o *options, res *loadResult, version string) *report {
	window := res.window.Seconds()
	rep := &report{
		KubeAPIServerVersion: version,
		EtcdServers:          o.etcdServers,
		Seconds:              o.seconds,
		WarmupSeconds:        o.warmup,
		Objects:              o.objects,
		Leases:               o.leases,
		MaxInFlight:          o.maxInFlight,
		PeakInFlight:         res.peakInFlight,
		APIServerCPUSeconds:  round3(res.usage.cpuSeconds),
		APIServerCPUCores:    round3(res.usage.cpuSeconds / window),
		APIServerRSSBytes:    res.usage.rssEnd,
		APIServerRSSMaxBytes: res.usage.rssMax,
		Verbs:                map[string]*verbReport{},
	}
	var writes, reads []time.Duration
	var maxLag time.Duration
	for _, st := range res.verbs {
		lat := slices.Clone(st.latencies)
		slices.Sort(lat)
		v := &verbReport{
			OfferedPerSec:  st.rate,
			Scheduled:      st.scheduled,
			Count:          len(lat),
			PerSec:         round3(float64(len(lat)) / window),
			Errors:         st.errors,
			ErrorSamples:   append([]string{}, st.errSamples...),
			Conflicts:      st.conflicts,
			BehindSchedule: st.behind,
			P50Ms:          percentileMs(lat, 0.50),
			P90Ms:          percentileMs(lat, 0.90),
			P99Ms:          percentileMs(lat, 0.99),
			MaxMs:          percentileMs(lat, 1),
		}
		if st.name == "list" {
			v.Pages = &st.pages
		}
		rep.Verbs[st.name] = v
		rep.order = append(rep.order, st.name)
		rep.OfferedPerSec += st.rate
		rep.Scheduled += st.scheduled
		rep.BehindSchedule += st.behind
		maxLag = max(maxLag, st.maxLag)
		if st.write {
			writes = append(writes, lat...)
		} else {
			reads = append(reads, lat...)
		}
	}
	slices.Sort(writes)
	slices.Sort(reads)
	rep.WriteCount, rep.WriteP50Ms, rep.WriteP99Ms = len(writes), percentileMs(writes, 0.50), percentileMs(writes, 0.99)
	rep.ReadCount, rep.ReadP50Ms, rep.ReadP99Ms = len(reads), percentileMs(reads, 0.50), percentileMs(reads, 0.99)
	if rep.Scheduled > 0 {
		rep.BehindScheduleFraction = round3(float64(rep.BehindSchedule) / float64(rep.Scheduled))
	}
	rep.MaxSendLagMs = round3(ms(maxLag))
	return rep
}

// writeRateOffered reports whether any write verb had a rate above zero.
func (r *report) writeRateOffered() bool {
	for name, v := range r.Verbs {
		if writeVerbs[name] && v.OfferedPerSec > 0 {
			return true
		}
	}
	return false
}

// percentileMs is the nearest-rank p-quantile of sorted in milliseconds, or
// nil when there are no samples.
func percentileMs(sorted []time.Duration, p float64) *float64 {
	if len(sorted) == 0 {
		return nil
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	v := round3(ms(sorted[max(0, min(i, len(sorted)-1))]))
	return &v
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

func (r *report) writeJSON(out io.Writer) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (r *report) writeTable(out io.Writer) error {
	fmt.Fprintf(out, "kube-apiserver %s on %s\n", r.KubeAPIServerVersion, strings.Join(r.EtcdServers, ","))
	fmt.Fprintf(out, "%gs measured after %gs warm-up; %d ConfigMaps, %d Leases\n\n", r.Seconds, r.WarmupSeconds, r.Objects, r.Leases)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "verb\toffered/s\tanswered/s\tcount\terrors\tconflicts\tbehind\tp50 ms\tp90 ms\tp99 ms\tmax ms\t")
	for _, name := range r.order {
		v := r.Verbs[name]
		fmt.Fprintf(tw, "%s\t%g\t%.1f\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t\n", name, v.OfferedPerSec, v.PerSec,
			v.Count, v.Errors, v.Conflicts, v.BehindSchedule, fmtMs(v.P50Ms), fmtMs(v.P90Ms), fmtMs(v.P99Ms), fmtMs(v.MaxMs))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if v := r.Verbs["list"]; v != nil && v.Pages != nil && v.Count > 0 {
		fmt.Fprintf(out, "\nlists: %d pages in %d lists (%.1f per list)\n", *v.Pages, v.Count, float64(*v.Pages)/float64(v.Count))
	}
	fmt.Fprintf(out, "\nwrites (create+update+lease): %d, p50 %s ms, p99 %s ms\n", r.WriteCount, fmtMs(r.WriteP50Ms), fmtMs(r.WriteP99Ms))
	fmt.Fprintf(out, "reads (get+list):             %d, p50 %s ms, p99 %s ms\n", r.ReadCount, fmtMs(r.ReadP50Ms), fmtMs(r.ReadP99Ms))
	fmt.Fprintf(out, "offered %g/s; behind schedule %d of %d (%.1f%%), max send lag %.1f ms; peak in flight %d (cap %d)\n",
		r.OfferedPerSec, r.BehindSchedule, r.Scheduled, 100*r.BehindScheduleFraction, r.MaxSendLagMs, r.PeakInFlight, r.MaxInFlight)
	fmt.Fprintf(out, "kube-apiserver: %.2f CPU s in the window (%.2f cores), RSS %.0f MiB at the end (max %.0f MiB)\n",
		r.APIServerCPUSeconds, r.APIServerCPUCores, float64(r.APIServerRSSBytes)/(1<<20), float64(r.APIServerRSSMaxBytes)/(1<<20))
	for _, name := range r.order {
		for _, e := range r.Verbs[name].ErrorSamples {
			fmt.Fprintf(out, "error (%s): %s\n", name, e)
		}
	}
	return nil
}

func fmtMs(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f", *v)
}
