package controlplane

import (
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
	"time"
)

// PKI holds the files kube-apiserver and its clients need, generated in Go
// with no external tools.
type PKI struct {
	CAFile    string // self-signed ECDSA CA certificate (PEM)
	CertFile  string // kube-apiserver's serving certificate, signed by the CA
	KeyFile   string // its private key
	SAKeyFile string // RSA key for signing and verifying service-account tokens
	TokenFile string // --token-auth-file with one admin token in system:masters
	Token     string // that admin bearer token
	CAPool    *x509.CertPool
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// GeneratePKI writes a new CA, a serving certificate for 127.0.0.1, 10.0.0.1
// and the kubernetes.default names, a service-account key and a token file
// into dir. Everything is valid for 24 hours.
func GeneratePKI(dir string) (*PKI, error) {
	p := &PKI{
		CAFile:    filepath.Join(dir, "ca.crt"),
		CertFile:  filepath.Join(dir, "apiserver.crt"),
		KeyFile:   filepath.Join(dir, "apiserver.key"),
		SAKeyFile: filepath.Join(dir, "sa.key"),
		TokenFile: filepath.Join(dir, "tokens.csv"),
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
	if err := writePEM(p.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	p.CAPool = x509.NewCertPool()
	p.CAPool.AddCert(caCert)

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
	if err := writePEM(p.CertFile, "CERTIFICATE", srvDER); err != nil {
		return nil, err
	}
	srvKeyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.KeyFile, "EC PRIVATE KEY", srvKeyDER); err != nil {
		return nil, err
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.SAKeyFile, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)); err != nil {
		return nil, err
	}

	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	p.Token = fmt.Sprintf("%x", tok)
	// token,user,uid,"group1,group2"
	line := fmt.Sprintf("%s,admin,admin-uid,\"system:masters\"\n", p.Token)
	if err := os.WriteFile(p.TokenFile, []byte(line), 0o600); err != nil {
		return nil, err
	}
	return p, nil
}

// WriteKubeconfig writes a kubeconfig for server (an https URL) that trusts
// the CA and authenticates with the admin token.
func (p *PKI) WriteKubeconfig(path, server string) error {
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
`, server, p.CAFile, p.Token)
	return os.WriteFile(path, []byte(cfg), 0o600)
}
