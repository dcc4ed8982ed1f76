// Debian's Prometheus, scraping the three members every second under job "etcd" and
// evaluating the shortened mixin rules every second, read through its HTTP API.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type prometheus struct {
	base string
	cmd  *exec.Cmd
	done chan struct{}
	http *http.Client
}

func startPrometheus(bin, dir string, port int, targets []string, rules string) (*prometheus, error) {
	if err := os.MkdirAll(filepath.Join(dir, "tsdb"), 0o755); err != nil {
		return nil, err
	}
	quoted := make([]string, len(targets))
	for i, t := range targets {
		quoted[i] = strconv.Quote(t)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: %s
    static_configs:
      - targets: [%s]
`, rules, jobName, strings.Join(quoted, ", "))
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		return nil, err
	}
	p := &prometheus{
		base: fmt.Sprintf("http://127.0.0.1:%d", port),
		done: make(chan struct{}),
		http: &http.Client{Timeout: 5 * time.Second},
	}
	p.cmd = exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port), "--log.level=warn")
	p.cmd.Stdout, p.cmd.Stderr = log, log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.cmd.Wait(); log.Close(); close(p.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := p.http.Get(p.base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p, nil
			}
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("prometheus exited; see %s", log.Name())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("prometheus not ready after 30 s")
		}
	}
}

func (p *prometheus) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *prometheus) get(path string, q url.Values, out any) error {
	resp, err := p.http.Get(p.base + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", path, env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s sample) value() float64 {
	str, _ := s.Value[1].(string)
	v, err := strconv.ParseFloat(str, 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// query evaluates an instant query now.
func (p *prometheus) query(expr string) ([]sample, error) {
	return p.queryAt(expr, time.Time{})
}

// queryAt evaluates an instant query at t (now if zero).
func (p *prometheus) queryAt(expr string, t time.Time) ([]sample, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	q := url.Values{"query": {expr}}
	if !t.IsZero() {
		q.Set("time", strconv.FormatFloat(float64(t.UnixNano())/1e9, 'f', 3, 64))
	}
	if err := p.get("/api/v1/query", q, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("%s: result type %s", expr, data.ResultType)
	}
	var out []sample
	return out, json.Unmarshal(data.Result, &out)
}

// hasData: at least one sample that is a number (a quantile over buckets that did not move
// is NaN, which a dashboard draws as nothing).
func hasData(ss []sample) bool {
	for _, s := range ss {
		if !math.IsNaN(s.value()) {
			return true
		}
	}
	return false
}

// firing returns the keys (name and severity) of the alerts firing now.
func (p *prometheus) firing() ([]string, error) {
	var data struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	if err := p.get("/api/v1/alerts", nil, &data); err != nil {
		return nil, err
	}
	var out []string
	for _, a := range data.Alerts {
		if a.State == "firing" {
			out = append(out, alertRule{Name: a.Labels["alertname"], Severity: a.Labels["severity"]}.key())
		}
	}
	return out, nil
}

// ruleErrors returns the last evaluation error of each rule that has one.
func (p *prometheus) ruleErrors() (map[string]string, int, error) {
	var data struct {
		Groups []struct {
			Rules []struct {
				Name      string            `json:"name"`
				Labels    map[string]string `json:"labels"`
				Health    string            `json:"health"`
				LastError string            `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get("/api/v1/rules", nil, &data); err != nil {
		return nil, 0, err
	}
	out := map[string]string{}
	n := 0
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health == "err" || r.LastError != "" {
				out[alertRule{Name: r.Name, Severity: r.Labels["severity"]}.key()] = r.LastError
			}
		}
	}
	return out, n, nil
}

// metricNames returns every metric name scraped from the members during the run.
func (p *prometheus) metricNames() (map[string]bool, error) {
	var names []string
	q := url.Values{"match[]": {fmt.Sprintf(`{job=%q}`, jobName)}}
	if err := p.get("/api/v1/label/__name__/values", q, &names); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out, nil
}
