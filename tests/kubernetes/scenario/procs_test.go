package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cairn-kv/cairn/tests/kubernetes/internal/controlplane"
	"github.com/cairn-kv/cairn/tests/kubernetes/internal/loopback"
)

// Shorter names for the shared helpers the steps use.
var (
	poll      = controlplane.Poll
	tailFile  = controlplane.TailFile
	freePorts = loopback.FreePorts
)

// ---------------------------------------------------------------- cairn

type cairnMember struct {
	*controlplane.Proc
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
		m.Proc = &controlplane.Proc{Name: "cairn-" + name, Bin: bin, LogPath: filepath.Join(dir, "cairn-"+name+".log")}
		initial = append(initial, name+"="+m.peerURL)
		c.members = append(c.members, m)
	}
	for i, m := range c.members {
		name := fmt.Sprintf("m%d", i+1)
		m.Args = []string{
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
		if err := m.Start(); err != nil {
			c.stop()
			return nil, err
		}
	}
	for _, m := range c.members {
		if err := m.waitHealthy(60 * time.Second); err != nil {
			c.stop()
			return nil, fmt.Errorf("%s: %w", m.Name, err)
		}
	}
	return c, nil
}

func (c *cairnCluster) stop() {
	for _, m := range c.members {
		m.Stop()
	}
}

func (m *cairnMember) waitHealthy(timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second}
	return poll(timeout, 100*time.Millisecond, func() (bool, string, error) {
		if !m.Alive() {
			return false, "", fmt.Errorf("exited before becoming healthy: %v", m.ExitErr())
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
		if !m.Alive() {
			why = append(why, m.Name+": not running")
			continue
		}
		cli, err := newEtcdClient(m.clientURL)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %v", m.Name, err))
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := cli.Status(sctx, m.clientURL)
		cancel()
		cli.Close()
		if err != nil {
			why = append(why, fmt.Sprintf("%s: status: %v", m.Name, err))
			continue
		}
		if st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i, nil
		}
		why = append(why, fmt.Sprintf("%s: member %x, leader %x", m.Name, st.Header.MemberId, st.Leader))
	}
	return -1, fmt.Errorf("no leader: %s", strings.Join(why, "; "))
}

// ---------------------------------------------------------------- metrics

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
