package scenario

import (
	"bytes"
	"context"
	"crypto/tls"
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
	name      string // the member's name (--name)
	dataDir   string
	clientURL string
	peerURL   string
	// metricsURL is the plaintext --listen-metrics-urls (kubeadm's probe
	// port), set only with TLS; /health and /metrics are read there then.
	metricsURL string
	pki        *controlplane.EtcdMemberPKI // this member's node certificates; nil: plaintext
}

type cairnCluster struct {
	members []*cairnMember
	// clientTLS is what the test's own clientv3 clients use with TLS: the
	// etcd CA and the first node's healthcheck client certificate, as
	// `etcdctl --cacert ca.crt --cert healthcheck-client.crt` on a kubeadm node.
	clientTLS *tls.Config
}

func (c *cairnCluster) clientURLs() []string {
	var out []string
	for _, m := range c.members {
		out = append(out, m.clientURL)
	}
	return out
}

// memberNames are the cairn members' names (and, with TLS, node names).
var memberNames = []string{"m1", "m2", "m3"}

// startCairnCluster starts three members on loopback and waits until each is
// healthy. With pki nil they are plaintext. Otherwise they run with kubeadm's
// etcd flags (cmd/kubeadm/app/phases/etcd/local.go): https client and peer
// URLs, the node's server and peer certificates, client certificates required
// on both ports, and a plaintext --listen-metrics-urls, where health is polled.
func startCairnCluster(bin, dir string, pki *controlplane.EtcdPKI) (*cairnCluster, error) {
	c, err := newCluster(bin, dir, "cairn", pki)
	if err != nil {
		return nil, err
	}
	return c, c.start()
}

// newCluster sets up three members of bin (cairn, or etcd: both take etcd's
// flags) bootstrapping a new cluster on free loopback ports, without starting
// them. Their logs and data dirs in dir are named after prefix.
func newCluster(bin, dir, prefix string, pki *controlplane.EtcdPKI) (*cairnCluster, error) {
	perMember := 2
	scheme := "http"
	if pki != nil {
		perMember, scheme = 3, "https"
	}
	ports, err := freePorts(perMember * len(memberNames))
	if err != nil {
		return nil, err
	}
	c := &cairnCluster{}
	if pki != nil {
		n := pki.Members[0]
		if c.clientTLS, err = controlplane.ClientTLSConfig(n.CAFile, n.HealthcheckClientCertFile, n.HealthcheckClientKeyFile); err != nil {
			return nil, err
		}
	}
	for i, name := range memberNames {
		m := &cairnMember{
			name:      name,
			clientURL: fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[perMember*i]),
			peerURL:   fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[perMember*i+1]),
		}
		if pki != nil {
			m.metricsURL = fmt.Sprintf("http://127.0.0.1:%d", ports[perMember*i+2])
			m.pki = pki.Members[i]
		}
		c.members = append(c.members, m)
	}
	c.setUp(bin, dir, prefix, true)
	return c, nil
}

// successor sets up a cluster of bin on the same member names and URLs as c,
// on data dirs restored from a snapshot (so without
// --initial-cluster-state new), without starting it. Its logs and data dirs
// in dir are named after prefix. c must be stopped before it starts.
func (c *cairnCluster) successor(bin, dir, prefix string) *cairnCluster {
	next := &cairnCluster{clientTLS: c.clientTLS}
	for _, m := range c.members {
		next.members = append(next.members, &cairnMember{
			name:       m.name,
			clientURL:  m.clientURL,
			peerURL:    m.peerURL,
			metricsURL: m.metricsURL,
			pki:        m.pki,
		})
	}
	next.setUp(bin, dir, prefix, false)
	return next
}

// initialCluster is the --initial-cluster value naming every member.
func (c *cairnCluster) initialCluster() string {
	var initial []string
	for _, m := range c.members {
		initial = append(initial, m.name+"="+m.peerURL)
	}
	return strings.Join(initial, ",")
}

// setUp gives each member its process, data dir and flags. With bootstrap,
// the members start a new cluster (--initial-cluster-state new); without it,
// their data dirs already hold the membership.
func (c *cairnCluster) setUp(bin, dir, prefix string, bootstrap bool) {
	initial := c.initialCluster()
	for _, m := range c.members {
		label := prefix + "-" + m.name
		m.dataDir = filepath.Join(dir, label+".data")
		m.Proc = &controlplane.Proc{Name: label, Bin: bin, LogPath: filepath.Join(dir, label+".log")}
		state := []string{}
		if bootstrap {
			state = []string{"--initial-cluster-state", "new"}
		}
		if m.pki == nil {
			m.Args = []string{
				"--name", m.name,
				"--data-dir", m.dataDir,
				"--listen-client-urls", m.clientURL,
				"--advertise-client-urls", m.clientURL,
				"--listen-peer-urls", m.peerURL,
				"--initial-advertise-peer-urls", m.peerURL,
				"--initial-cluster", initial,
			}
			m.Args = append(m.Args, state...)
			m.Args = append(m.Args,
				// 2-core machines running a whole control plane: generous timeouts.
				"--heartbeat-interval", "100",
				"--election-timeout", "1000",
				"--watch-progress-notify-interval", "5s",
			)
		} else {
			// kubeadm's getEtcdCommand, in its order and spelling.
			m.Args = []string{
				"--name=" + m.name,
				"--listen-client-urls=" + m.clientURL,
				"--advertise-client-urls=" + m.clientURL,
				"--listen-peer-urls=" + m.peerURL,
				"--initial-advertise-peer-urls=" + m.peerURL,
				"--data-dir=" + m.dataDir,
			}
			m.Args = append(m.Args, m.pki.EtcdTLSArgs()...)
			m.Args = append(m.Args,
				"--snapshot-count=10000",
				"--listen-metrics-urls="+m.metricsURL,
				"--feature-gates=InitialCorruptCheck=true",
				"--watch-progress-notify-interval=5s",
				"--initial-cluster="+initial,
			)
			if bootstrap {
				m.Args = append(m.Args, "--initial-cluster-state=new")
			}
			m.Args = append(m.Args,
				// Not kubeadm's: the harness's timeouts for a 2-core machine.
				"--heartbeat-interval=100",
				"--election-timeout=1000",
			)
		}
	}
}

// start starts every member, then waits until each is healthy (none is before
// a quorum runs). On failure it stops them all.
func (c *cairnCluster) start() error {
	for _, m := range c.members {
		if err := m.Start(); err != nil {
			c.stop()
			return err
		}
	}
	for _, m := range c.members {
		if err := m.waitHealthy(60 * time.Second); err != nil {
			c.stop()
			return fmt.Errorf("%s: %w", m.Name, err)
		}
	}
	return nil
}

func (c *cairnCluster) stop() {
	for _, m := range c.members {
		m.Stop()
	}
}

// httpURL is where the member's /health and /metrics are read over plain
// HTTP: the metrics URL with TLS, else the client URL.
func (m *cairnMember) httpURL() string {
	if m.metricsURL != "" {
		return m.metricsURL
	}
	return m.clientURL
}

func (m *cairnMember) waitHealthy(timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second}
	return poll(timeout, 100*time.Millisecond, func() (bool, string, error) {
		if !m.Alive() {
			return false, "", fmt.Errorf("exited before becoming healthy: %v", m.ExitErr())
		}
		resp, err := client.Get(m.httpURL() + "/health")
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
	resp, err := client.Get(m.httpURL() + "/metrics")
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

// etcdClient is a clientv3 client of endpoints, with the cluster's client
// TLS if it has any.
func (c *cairnCluster) etcdClient(endpoints ...string) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	}
	if c.clientTLS != nil {
		cfg.TLS = c.clientTLS.Clone()
	}
	return clientv3.New(cfg)
}

// leader returns the index of the member that reports itself leader.
func (c *cairnCluster) leader(ctx context.Context) (int, error) {
	var why []string
	for i, m := range c.members {
		if !m.Alive() {
			why = append(why, m.Name+": not running")
			continue
		}
		cli, err := c.etcdClient(m.clientURL)
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
