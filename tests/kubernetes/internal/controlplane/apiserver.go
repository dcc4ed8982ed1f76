package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/cairn-kv/cairn/tests/kubernetes/internal/loopback"
)

// APIServerConfig says how to run kube-apiserver.
type APIServerConfig struct {
	BinDir      string   // directory holding the kube-apiserver binary
	Dir         string   // work dir: kube-apiserver.log and apiserver-certs/ go here
	EtcdServers []string // client URLs of the storage (cairn or etcd)
	PKI         *PKI     // from GeneratePKI
	// EtcdCAFile, EtcdCertFile and EtcdKeyFile, when set, become --etcd-cafile,
	// --etcd-certfile and --etcd-keyfile: the CA that signed the storage's
	// serving certificates and kube-apiserver's client certificate (kubeadm:
	// pki/etcd/ca.crt and pki/apiserver-etcd-client.{crt,key}). EtcdServers
	// are then https URLs.
	EtcdCAFile, EtcdCertFile, EtcdKeyFile string
	// ExtraArgs are appended after the flags StartAPIServer always passes
	// (storage, loopback serving, TLS, service accounts, token auth, RBAC);
	// for a flag given twice, kube-apiserver keeps the last value.
	ExtraArgs []string
	// ReadyTimeout bounds the wait for /readyz; zero means 4 minutes.
	ReadyTimeout time.Duration
}

// APIServer is a running kube-apiserver on 127.0.0.1.
type APIServer struct {
	*Proc
	URL string // https://127.0.0.1:<secure port>
	PKI *PKI
}

// baseArgs are the flags kube-apiserver needs to serve on loopback port port
// from etcdServers with the PKI p, and nothing more: every other setting is
// kube-apiserver's default. The admin token authenticates as system:masters.
func baseArgs(etcdServers []string, port int, p *PKI, certDir string) []string {
	return []string{
		"--etcd-servers=" + strings.Join(etcdServers, ","),
		"--authorization-mode=RBAC",
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The endpoint reconciler refuses a loopback advertise address.
		"--endpoint-reconciler-type=none",
		fmt.Sprintf("--secure-port=%d", port),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.SAKeyFile,
		"--service-account-signing-key-file=" + p.SAKeyFile,
		"--tls-cert-file=" + p.CertFile,
		"--tls-private-key-file=" + p.KeyFile,
		"--client-ca-file=" + p.CAFile,
		"--token-auth-file=" + p.TokenFile,
		"--cert-dir=" + certDir,
	}
}

// StartAPIServer starts kube-apiserver on a free loopback port and waits until
// /readyz answers 200 (or ctx is done). Once the process has been started, the
// APIServer is returned even with an error (the process then stopped), so that
// the caller can show its log.
func StartAPIServer(ctx context.Context, cfg APIServerConfig) (*APIServer, error) {
	ports, err := loopback.FreePorts(1)
	if err != nil {
		return nil, err
	}
	a := &APIServer{
		URL: fmt.Sprintf("https://127.0.0.1:%d", ports[0]),
		PKI: cfg.PKI,
		Proc: &Proc{
			Name:    "kube-apiserver",
			Bin:     filepath.Join(cfg.BinDir, "kube-apiserver"),
			LogPath: filepath.Join(cfg.Dir, "kube-apiserver.log"),
		},
	}
	a.Args = baseArgs(cfg.EtcdServers, ports[0], cfg.PKI, filepath.Join(cfg.Dir, "apiserver-certs"))
	for _, f := range []struct{ flag, file string }{
		{"--etcd-cafile", cfg.EtcdCAFile}, {"--etcd-certfile", cfg.EtcdCertFile}, {"--etcd-keyfile", cfg.EtcdKeyFile},
	} {
		if f.file != "" {
			a.Args = append(a.Args, f.flag+"="+f.file)
		}
	}
	a.Args = append(a.Args, cfg.ExtraArgs...)
	if err := a.Start(); err != nil {
		return a, err
	}
	timeout := cfg.ReadyTimeout
	if timeout == 0 {
		timeout = 4 * time.Minute
	}
	if err := a.WaitReady(ctx, timeout); err != nil {
		a.Stop()
		return a, fmt.Errorf("waiting for kube-apiserver /readyz: %w", err)
	}
	return a, nil
}

// WaitReady polls /readyz until it answers 200, the process exits, ctx is done
// or timeout passes; the error names the checks that were failing.
func (a *APIServer) WaitReady(ctx context.Context, timeout time.Duration) error {
	return Poll(timeout, 500*time.Millisecond, func() (bool, string, error) {
		if err := ctx.Err(); err != nil {
			return false, "", err
		}
		if !a.Alive() {
			return false, "", fmt.Errorf("kube-apiserver exited: %v", a.ExitErr())
		}
		code, body, err := a.Get(ctx, "/readyz")
		if err != nil {
			return false, err.Error(), nil
		}
		if code == http.StatusOK {
			return true, "", nil
		}
		return false, fmt.Sprintf("/readyz %d: %s", code, FailedChecks(body)), nil
	})
}

// Get does GET path (e.g. "/metrics") with the admin token and returns the
// status code and body.
func (a *APIServer) Get(ctx context.Context, path string) (int, string, error) {
	return HTTPSGet(ctx, a.URL+path, a.PKI.Token, a.PKI.CAPool)
}

// RESTConfig returns a new client-go config for the admin user. Rate limits,
// timeouts and content types are left to the caller.
func (a *APIServer) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            a.URL,
		BearerToken:     a.PKI.Token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: a.PKI.CAFile},
	}
}

// HTTPSGet does GET url with a bearer token, trusting the CAs in ca, with a
// 10 s timeout; it returns the status code and body.
func HTTPSGet(ctx context.Context, url, token string, ca *x509.CertPool) (int, string, error) {
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca}},
	}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
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

// FailedChecks keeps the "[-]" lines of a /readyz or /livez body, or returns
// the whole body if it has none.
func FailedChecks(body string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "[-]") {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return strings.TrimSpace(body)
	}
	return strings.Join(out, " | ")
}
