package scenario

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cairn-kv/cairn/tests/kubernetes/internal/loopback"
)

// proc is one child process (a cairn member or a Kubernetes component) whose
// stdout and stderr go to a log file. It can be SIGKILLed and started again
// with the same arguments.
type proc struct {
	name    string
	bin     string
	args    []string
	logPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

func (p *proc) start() error {
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logFile, "=== %s start %s: %s %s\n", p.name, time.Now().Format(time.RFC3339Nano), p.bin, strings.Join(p.args, " "))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Kill the child if the test binary dies without running its cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited, p.waitErr = cmd, exited, nil
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logFile.Close()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

func (p *proc) exitedCh() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

func (p *proc) alive() bool {
	ch := p.exitedCh()
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

func (p *proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	if !p.alive() {
		return
	}
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	_ = cmd.Process.Kill()
	<-p.exitedCh()
}

// stop sends SIGTERM, then SIGKILL after a grace period.
func (p *proc) stop() {
	if !p.alive() {
		return
	}
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exitedCh():
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-p.exitedCh()
	}
}

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		if len(l) > 400 {
			lines[i] = l[:400] + "…"
		}
	}
	return strings.Join(lines, "\n")
}

// freePorts: see loopback.FreePorts.
var freePorts = loopback.FreePorts

// poll calls cond every interval until it returns true or an error, or timeout
// passes; it returns the last "why not" message on timeout.
func poll(timeout, interval time.Duration, cond func() (bool, string, error)) error {
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, why, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		last = why
		if time.Now().After(deadline) {
			return fmt.Errorf("condition not met after %v (last: %s)", timeout, last)
		}
		time.Sleep(interval)
	}
}

// ---------------------------------------------------------------- cairn

type cairnMember struct {
	*proc
	clientURL string
	peerURL   string
}

type cairnCluster struct {
	members []*cairnMember
}

func (c *cairnCluster) clientURLs() []string {
	var out []string
	for _, m := range c.members {
		out = append(out, m.clientURL)
	}
	return out
}

func startCairnCluster(bin, dir string) (*cairnCluster, error) {
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	c := &cairnCluster{}
	var initial []string
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("m%d", i+1)
		m := &cairnMember{
			clientURL: fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]),
			peerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
		}
		m.proc = &proc{name: "cairn-" + name, bin: bin, logPath: filepath.Join(dir, "cairn-"+name+".log")}
		initial = append(initial, name+"="+m.peerURL)
		c.members = append(c.members, m)
	}
	for i, m := range c.members {
		name := fmt.Sprintf("m%d", i+1)
		m.args = []string{
			"--name", name,
			"--data-dir", filepath.Join(dir, "cairn-"+name+".data"),
			"--listen-client-urls", m.clientURL,
			"--advertise-client-urls", m.clientURL,
			"--listen-peer-urls", m.peerURL,
			"--initial-advertise-peer-urls", m.peerURL,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			// 2-core machines running a whole control plane: generous timeouts.
			"--heartbeat-interval", "100",
			"--election-timeout", "1000",
			"--watch-progress-notify-interval", "5s",
		}
		if err := m.start(); err != nil {
			c.stop()
			return nil, err
		}
	}
	for _, m := range c.members {
		if err := m.waitHealthy(60 * time.Second); err != nil {
			c.stop()
			return nil, fmt.Errorf("%s: %w", m.name, err)
		}
	}
	return c, nil
}

func (c *cairnCluster) stop() {
	for _, m := range c.members {
		m.stop()
	}
}

func (m *cairnMember) waitHealthy(timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second}
	return poll(timeout, 100*time.Millisecond, func() (bool, string, error) {
		if !m.alive() {
			return false, "", fmt.Errorf("exited before becoming healthy: %v", m.exitErr())
		}
		resp, err := client.Get(m.clientURL + "/health")
		if err != nil {
			return false, err.Error(), nil
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var h struct {
			Health string `json:"health"`
		}
		if resp.StatusCode == http.StatusOK && json.Unmarshal(body, &h) == nil && h.Health == "true" {
			return true, "", nil
		}
		return false, fmt.Sprintf("GET /health: %d %s", resp.StatusCode, bytes.TrimSpace(body)), nil
	})
}

func (m *cairnMember) metrics() (string, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(m.clientURL + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("GET /metrics: %d", resp.StatusCode)
	}
	return string(body), err
}

func newEtcdClient(endpoints ...string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
}

// leader returns the index of the member that reports itself leader.
func (c *cairnCluster) leader(ctx context.Context) (int, error) {
	var why []string
	for i, m := range c.members {
		if !m.alive() {
			why = append(why, m.name+": not running")
			continue
		}
		cli, err := newEtcdClient(m.clientURL)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %v", m.name, err))
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := cli.Status(sctx, m.clientURL)
		cancel()
		cli.Close()
		if err != nil {
			why = append(why, fmt.Sprintf("%s: status: %v", m.name, err))
			continue
		}
		if st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i, nil
		}
		why = append(why, fmt.Sprintf("%s: member %x, leader %x", m.name, st.Header.MemberId, st.Leader))
	}
	return -1, fmt.Errorf("no leader: %s", strings.Join(why, "; "))
}

// ---------------------------------------------------------------- kube

// httpsGet does GET url with the admin bearer token against the apiserver.
func httpsGet(ctx context.Context, url, token string, ca *x509.CertPool) (int, string, error) {
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca}},
	}
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// metricLines returns the sample lines of a Prometheus text exposition whose
// metric name is name (any labels), sorted.
func metricLines(text, name string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+" ") {
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}

// metricValue sums the samples of name whose label set contains every one of
// labels (each written `key="value"`).
func metricValue(text, name string, labels ...string) (float64, bool) {
	var sum float64
	found := false
	for _, l := range metricLines(text, name) {
		ok := true
		for _, lb := range labels {
			if !strings.Contains(l, lb) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		i := strings.LastIndex(l, " ")
		var v float64
		if _, err := fmt.Sscanf(l[i+1:], "%g", &v); err == nil {
			sum += v
			found = true
		}
	}
	return sum, found
}
