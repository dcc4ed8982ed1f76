package scenario

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-kv/cairn/tests/kubernetes/internal/controlplane"
)

// TestScenarioMTLS runs part of the scenario with kubeadm's etcd certificate
// layout: the three cairn members serve clients and peers over mutual TLS
// with kubeadm's etcd flags, and kube-apiserver reaches them with
// --etcd-cafile/--etcd-certfile/--etcd-keyfile (see ../README.md).
func TestScenarioMTLS(t *testing.T) {
	h := setupHarness(t, true)
	h.runSteps(t, []step{
		{"Namespaces", testNamespaces},
		{"MemberTLS", testMemberTLS},
		{"KubeadmProbes", testKubeadmProbes},
		{"OptimisticConcurrency", testConflicts},
		{"Watches", testWatches},
		{"RangeStream", testRangeStream},
		{"LeaderKill", testLeaderKill},
		{"AcknowledgedWritesAtEnd", testAckedAtEnd},
	})
}

// hostPort is the host:port of an http(s) URL.
func hostPort(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatalf("parse %q: %v", u, err)
	}
	return p.Host
}

// tlsHealth dials addr with cfg, sends GET /health over HTTP/1.1 and reads
// the answer. handshook says whether the client's side of the handshake
// completed; err is what ended the exchange before an HTTP response.
//
// With TLS 1.3 the client's side of the handshake ends before the server has
// checked the client's certificate, so a server's refusal arrives as an alert
// on the first read rather than from tls.Dial; the request is what makes it
// show.
func tlsHealth(addr string, cfg *tls.Config) (status int, body string, handshook bool, err error) {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"http/1.1"}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return 0, "", false, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET /health HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", addr); err != nil {
		return 0, "", true, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, "", true, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), true, err
}

// expectRefused checks that the member refused the TLS connection: no HTTP
// answer, and a TLS alert from the server (not a timeout).
func expectRefused(t *testing.T, what, addr string, cfg *tls.Config) {
	t.Helper()
	code, body, handshook, err := tlsHealth(addr, cfg)
	switch {
	case err == nil:
		t.Errorf("%s: %s accepted the connection and answered GET /health with %d %s; want the handshake refused", what, addr, code, strings.TrimSpace(body))
	case isTimeout(err):
		t.Errorf("%s: %s neither answered nor refused within the deadline: %v", what, addr, err)
	case !strings.Contains(err.Error(), "remote error: tls:"):
		t.Errorf("%s: %s ended the connection with %q, want a TLS alert (\"remote error: tls: ...\") refusing the certificate", what, addr, err)
	default:
		t.Logf("%s: %s refused (client side of the handshake done: %v): %v", what, addr, handshook, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// testMemberTLS checks each member's ports the way kubeadm's certificates
// are meant to work: the healthcheck client certificate is accepted on the
// client port, while a client certificate from another CA (with the same
// subject and SANs as kube-apiserver's) and no client certificate at all are
// refused, and the foreign certificate is refused on the peer port too; a
// plaintext request to the client port gets no health answer.
func testMemberTLS(t *testing.T, h *harness) {
	node := h.etcdPKI.Members[0]
	good, err := controlplane.ClientTLSConfig(node.CAFile, node.HealthcheckClientCertFile, node.HealthcheckClientKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	noCert, err := controlplane.ClientTLSConfig(node.CAFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	// A client certificate like apiserver-etcd-client.crt, also valid as a peer
	// certificate (both usages, SANs 127.0.0.1 and localhost), signed by a CA
	// the members do not trust. The client trusts the etcd CA, so the only
	// reason to refuse is the member's check of the client certificate.
	fdir := filepath.Join(h.dir, "foreign-pki")
	foreignCA, err := controlplane.NewCertAuthority("foreign-etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	if err := foreignCA.Write(filepath.Join(fdir, "ca.crt"), filepath.Join(fdir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	fcert, fkey := filepath.Join(fdir, "apiserver-etcd-client.crt"), filepath.Join(fdir, "apiserver-etcd-client.key")
	if err := foreignCA.Issue(fcert, fkey, controlplane.CertSpec{
		CommonName:   controlplane.APIServerEtcdClientCommonName,
		Organization: []string{controlplane.APIServerEtcdClientOrganization},
		DNSNames:     []string{"localhost"},
		IPs:          []net.IP{net.ParseIP("127.0.0.1")},
		Usages:       []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}); err != nil {
		t.Fatal(err)
	}
	foreign, err := controlplane.ClientTLSConfig(node.CAFile, fcert, fkey)
	if err != nil {
		t.Fatal(err)
	}
	// Go's client sends a certificate only if its issuer is among the CAs the
	// server's CertificateRequest names, so it would send none here: present
	// the foreign certificate regardless, as a misconfigured client would.
	foreignPair := foreign.Certificates[0]
	foreign.Certificates = nil
	foreign.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &foreignPair, nil }
	plain := &http.Client{Timeout: 5 * time.Second}

	for _, m := range h.cairn.members {
		client, peer := hostPort(t, m.clientURL), hostPort(t, m.peerURL)

		// Positive control: the same request with a certificate from the etcd CA.
		code, body, _, err := tlsHealth(client, good)
		var hb struct {
			Health string `json:"health"`
		}
		if err != nil {
			t.Errorf("%s client port %s with the healthcheck client certificate: %v", m.Name, client, err)
		} else if code != http.StatusOK || json.Unmarshal([]byte(body), &hb) != nil || hb.Health != "true" {
			t.Errorf("%s client port %s with the healthcheck client certificate: GET /health %d %s, want 200 with \"health\":\"true\"", m.Name, client, code, strings.TrimSpace(body))
		}

		expectRefused(t, m.Name+" client port, foreign-CA client certificate", client, foreign)
		expectRefused(t, m.Name+" client port, no client certificate", client, noCert)
		expectRefused(t, m.Name+" peer port, foreign-CA client certificate", peer, foreign)

		resp, err := plain.Get("http://" + client + "/health")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("%s: plaintext GET /health on the TLS client port %s answered 200 %s", m.Name, client, strings.TrimSpace(string(b)))
			} else {
				t.Logf("%s: plaintext GET /health on the TLS client port: %d %s", m.Name, resp.StatusCode, strings.TrimSpace(string(b)))
			}
		} else {
			t.Logf("%s: plaintext GET /health on the TLS client port: %v", m.Name, err)
		}
	}
	// The refused connections left every member serving.
	for _, m := range h.cairn.members {
		if err := m.waitHealthy(10 * time.Second); err != nil {
			t.Errorf("%s after the refused connections: %v", m.Name, err)
		}
	}
}

// testKubeadmProbes checks the metrics URL as kubeadm's etcd static pod uses
// it: the kubelet's liveness probe GET /livez and readiness and startup probes
// GET /readyz there over plain HTTP (200-399 is success), and Prometheus
// scrapes /metrics, all without a client certificate. /metrics must show a
// leader on every member and the gRPC requests served so far.
func testKubeadmProbes(t *testing.T, h *harness) {
	client := &http.Client{Timeout: 5 * time.Second}
	var total float64
	for _, m := range h.cairn.members {
		for _, path := range []string{"/livez", "/readyz"} {
			resp, err := client.Get(m.metricsURL + path)
			if err != nil {
				t.Errorf("%s GET %s%s: %v", m.Name, m.metricsURL, path, err)
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode < 200 || resp.StatusCode > 399 {
				t.Errorf("%s GET %s%s: %d %s (a kubelet probe fails)", m.Name, m.metricsURL, path, resp.StatusCode, strings.TrimSpace(string(b)))
			}
		}
		text, err := m.metrics()
		if err != nil {
			t.Errorf("%s metrics URL: %v", m.Name, err)
			continue
		}
		// Each member hears the leader over the mTLS peer connections.
		if v, found := metricValue(text, "etcd_server_has_leader"); !found || v != 1 {
			t.Errorf("%s %s/metrics: etcd_server_has_leader %v (found %v), want 1", m.Name, m.metricsURL, v, found)
		}
		// A member's gRPC counters appear with its first request.
		started, _ := metricValue(text, "grpc_server_started_total")
		total += started
		t.Logf("%s %s: /livez and /readyz pass; etcd_server_has_leader 1; grpc_server_started_total %v", m.Name, m.metricsURL, started)
	}
	// kube-apiserver's requests so far, all over mTLS, are counted there.
	if total == 0 {
		t.Errorf("grpc_server_started_total is 0 on every member's metrics URL, although kube-apiserver has been serving from them")
	}
}
