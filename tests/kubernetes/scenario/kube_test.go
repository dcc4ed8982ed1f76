package scenario

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// pki holds the files kube-apiserver and friends need, generated in Go.
type pki struct {
	caFile, certFile, keyFile string
	saKeyFile                 string
	tokenFile                 string
	token                     string
	caPool                    *x509.CertPool
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func generatePKI(dir string) (*pki, error) {
	p := &pki{
		caFile:    filepath.Join(dir, "ca.crt"),
		certFile:  filepath.Join(dir, "apiserver.crt"),
		keyFile:   filepath.Join(dir, "apiserver.key"),
		saKeyFile: filepath.Join(dir, "sa.key"),
		tokenFile: filepath.Join(dir, "tokens.csv"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "cairn-scenario-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.caFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(caCert)

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.certFile, "CERTIFICATE", srvDER); err != nil {
		return nil, err
	}
	srvKeyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.keyFile, "EC PRIVATE KEY", srvKeyDER); err != nil {
		return nil, err
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.saKeyFile, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)); err != nil {
		return nil, err
	}

	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	p.token = fmt.Sprintf("%x", tok)
	// token,user,uid,"group1,group2"
	line := fmt.Sprintf("%s,admin,admin-uid,\"system:masters\"\n", p.token)
	if err := os.WriteFile(p.tokenFile, []byte(line), 0o600); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *pki) writeKubeconfig(path, server string) error {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: scenario
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: scenario
  context:
    cluster: scenario
    user: admin
current-context: scenario
`, server, p.caFile, p.token)
	return os.WriteFile(path, []byte(cfg), 0o600)
}

// controlPlane is kube-apiserver, kube-controller-manager and kube-scheduler.
type controlPlane struct {
	apiserver, kcm, scheduler *proc
	url                       string
	pki                       *pki
	restConfig                *rest.Config
}

func (cp *controlPlane) procs() []*proc {
	var out []*proc
	for _, p := range []*proc{cp.scheduler, cp.kcm, cp.apiserver} {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

func (cp *controlPlane) stop() {
	for _, p := range cp.procs() {
		p.stop()
	}
}

func startAPIServer(binDir, dir string, etcdURLs []string, p *pki) (*controlPlane, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{pki: p, url: fmt.Sprintf("https://127.0.0.1:%d", ports[0])}
	cp.apiserver = &proc{
		name:    "kube-apiserver",
		bin:     filepath.Join(binDir, "kube-apiserver"),
		logPath: filepath.Join(dir, "kube-apiserver.log"),
		args: []string{
			"--etcd-servers=" + strings.Join(etcdURLs, ","),
			"--etcd-compaction-interval=5s",
			"--event-ttl=10s",
			"--authorization-mode=RBAC",
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			// The endpoint reconciler refuses a loopback advertise address.
			"--endpoint-reconciler-type=none",
			fmt.Sprintf("--secure-port=%d", ports[0]),
			"--service-cluster-ip-range=10.0.0.0/24",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + p.saKeyFile,
			"--service-account-signing-key-file=" + p.saKeyFile,
			"--tls-cert-file=" + p.certFile,
			"--tls-private-key-file=" + p.keyFile,
			"--client-ca-file=" + p.caFile,
			"--token-auth-file=" + p.tokenFile,
			"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
			"--enable-priority-and-fairness=false",
			// podtemplates bypass the watch cache: their watches and lists go
			// straight to cairn (used for the compaction / 410 Gone check).
			"--watch-cache-sizes=podtemplates#0",
			"--allow-privileged=true",
		},
	}
	if err := cp.apiserver.start(); err != nil {
		return cp, err
	}
	ctx := context.Background()
	err = poll(240*time.Second, 500*time.Millisecond, func() (bool, string, error) {
		if !cp.apiserver.alive() {
			return false, "", fmt.Errorf("kube-apiserver exited: %v", cp.apiserver.exitErr())
		}
		code, body, err := httpsGet(ctx, cp.url+"/readyz", p.token, p.caPool)
		if err != nil {
			return false, err.Error(), nil
		}
		if code == 200 {
			return true, "", nil
		}
		return false, fmt.Sprintf("/readyz %d: %s", code, failedChecks(body)), nil
	})
	if err != nil {
		cp.stop()
		return cp, fmt.Errorf("waiting for kube-apiserver /readyz: %w", err)
	}
	cp.restConfig = &rest.Config{
		Host:            cp.url,
		BearerToken:     p.token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: p.caFile},
		QPS:             200,
		Burst:           400,
		Timeout:         30 * time.Second,
	}

	kubeconfig := filepath.Join(dir, "admin.kubeconfig")
	if err := p.writeKubeconfig(kubeconfig, cp.url); err != nil {
		cp.stop()
		return cp, err
	}
	cp.kcm = &proc{
		name:    "kube-controller-manager",
		bin:     filepath.Join(binDir, "kube-controller-manager"),
		logPath: filepath.Join(dir, "kube-controller-manager.log"),
		args: []string{
			"--kubeconfig=" + kubeconfig,
			"--authentication-kubeconfig=" + kubeconfig,
			"--authorization-kubeconfig=" + kubeconfig,
			"--leader-elect=false",
			"--controllers=deployment,replicaset,serviceaccount,serviceaccount-token",
			"--service-account-private-key-file=" + p.saKeyFile,
			"--root-ca-file=" + p.caFile,
			"--use-service-account-credentials=false",
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", ports[1]),
			"--cert-dir=" + filepath.Join(dir, "kcm-certs"),
		},
	}
	cp.scheduler = &proc{
		name:    "kube-scheduler",
		bin:     filepath.Join(binDir, "kube-scheduler"),
		logPath: filepath.Join(dir, "kube-scheduler.log"),
		args: []string{
			"--kubeconfig=" + kubeconfig,
			"--authentication-kubeconfig=" + kubeconfig,
			"--authorization-kubeconfig=" + kubeconfig,
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", ports[2]),
			"--cert-dir=" + filepath.Join(dir, "scheduler-certs"),
		},
	}
	for _, pr := range []*proc{cp.kcm, cp.scheduler} {
		if err := pr.start(); err != nil {
			cp.stop()
			return cp, err
		}
	}
	return cp, nil
}

// failedChecks keeps the "[-]" lines of a /readyz or /livez body.
func failedChecks(body string) string {
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
