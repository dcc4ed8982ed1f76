package controlplane

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// CertAuthority is a self-signed CA that issues certificates, as kubeadm's
// CAs do: RSA 2048 keys (kubeadm's default encryptionAlgorithm), random
// serials, keys written as PKCS#1 "RSA PRIVATE KEY" with mode 0600 and
// certificates with mode 0644. Everything is valid for 24 hours.
type CertAuthority struct {
	Cert *x509.Certificate
	key  *rsa.PrivateKey
}

// CertSpec is what a leaf certificate says.
type CertSpec struct {
	CommonName   string
	Organization []string
	DNSNames     []string
	IPs          []net.IP
	Usages       []x509.ExtKeyUsage // serverAuth and/or clientAuth
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 63))
}

func writeCertAndKey(certPath, keyPath string, der []byte, key *rsa.PrivateKey) error {
	if err := os.MkdirAll(filepath.Dir(certPath), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(keyPath), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return writePEM(keyPath, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key))
}

// NewCertAuthority makes a CA whose subject CN is cn.
func NewCertAuthority(cn string) (*CertAuthority, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CertAuthority{Cert: cert, key: key}, nil
}

// Write writes the CA certificate and key (PEM) to certPath and keyPath.
func (ca *CertAuthority) Write(certPath, keyPath string) error {
	return writeCertAndKey(certPath, keyPath, ca.Cert.Raw, ca.key)
}

// Pool is a certificate pool holding only this CA.
func (ca *CertAuthority) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue signs a new leaf certificate for spec with a new RSA key and writes
// both (PEM) to certPath and keyPath.
func (ca *CertAuthority) Issue(certPath, keyPath string, spec CertSpec) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	serial, err := randomSerial()
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: spec.CommonName, Organization: spec.Organization},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  spec.Usages,
		DNSNames:     spec.DNSNames,
		IPAddresses:  spec.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return err
	}
	return writeCertAndKey(certPath, keyPath, der, key)
}

// EtcdMemberPKI is one control-plane node's share of kubeadm's etcd
// certificates. Dir stands for that node's /etc/kubernetes/pki; the file
// names below it are kubeadm's.
type EtcdMemberPKI struct {
	Name string // the etcd member name, also the node name in the certificates
	Dir  string

	CAFile, CAKeyFile                                       string // etcd/ca.crt, etcd/ca.key
	ServerCertFile, ServerKeyFile                           string // etcd/server.crt, etcd/server.key
	PeerCertFile, PeerKeyFile                               string // etcd/peer.crt, etcd/peer.key
	HealthcheckClientCertFile, HealthcheckClientKeyFile     string // etcd/healthcheck-client.crt, .key
	APIServerEtcdClientCertFile, APIServerEtcdClientKeyFile string // apiserver-etcd-client.crt, .key
}

// KubeadmEtcdMemberPKI names the files of member name's etcd certificates
// under certDir, a node's /etc/kubernetes/pki (kubeadm's certificatesDir),
// with kubeadm's file names (cmd/kubeadm/app/constants).
func KubeadmEtcdMemberPKI(name, certDir string) *EtcdMemberPKI {
	return &EtcdMemberPKI{
		Name:                        name,
		Dir:                         certDir,
		CAFile:                      filepath.Join(certDir, "etcd", "ca.crt"),
		CAKeyFile:                   filepath.Join(certDir, "etcd", "ca.key"),
		ServerCertFile:              filepath.Join(certDir, "etcd", "server.crt"),
		ServerKeyFile:               filepath.Join(certDir, "etcd", "server.key"),
		PeerCertFile:                filepath.Join(certDir, "etcd", "peer.crt"),
		PeerKeyFile:                 filepath.Join(certDir, "etcd", "peer.key"),
		HealthcheckClientCertFile:   filepath.Join(certDir, "etcd", "healthcheck-client.crt"),
		HealthcheckClientKeyFile:    filepath.Join(certDir, "etcd", "healthcheck-client.key"),
		APIServerEtcdClientCertFile: filepath.Join(certDir, "apiserver-etcd-client.crt"),
		APIServerEtcdClientKeyFile:  filepath.Join(certDir, "apiserver-etcd-client.key"),
	}
}

// EtcdPKI is kubeadm's etcd certificate layout for a stacked etcd whose
// members all run on this machine's loopback interface: one etcd CA, and per
// member a node directory with the CA, a server and a peer certificate, the
// healthcheck client certificate and kube-apiserver's etcd client certificate.
type EtcdPKI struct {
	CA      *CertAuthority
	CAPool  *x509.CertPool
	Members []*EtcdMemberPKI
}

// Subjects and usages as kubeadm's certs phase writes them
// (cmd/kubeadm/app/phases/certs/certlist.go).
const (
	EtcdCACommonName                = "etcd-ca"
	EtcdHealthcheckClientCommonName = "kube-etcd-healthcheck-client"
	APIServerEtcdClientCommonName   = "kube-apiserver-etcd-client"
	APIServerEtcdClientOrganization = "system:masters"
)

// etcdAltNames are kubeadm's SANs for an etcd member's server and peer
// certificates on a node whose name and advertise address are the member
// name and 127.0.0.1.
func etcdAltNames(name string) ([]string, []net.IP) {
	return []string{name, "localhost"}, []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback}
}

// GenerateEtcdPKI writes kubeadm's etcd certificates under dir: for each
// member a node directory dir/<member>/ laid out like /etc/kubernetes/pki:
//
//	etcd/ca.crt, etcd/ca.key                  the etcd CA (CN etcd-ca), same on every node
//	etcd/server.crt, etcd/server.key          CN <member>, SANs <member>, localhost, 127.0.0.1, ::1; serverAuth+clientAuth
//	etcd/peer.crt, etcd/peer.key              the same subject, SANs and usages
//	etcd/healthcheck-client.crt, .key         CN kube-etcd-healthcheck-client; clientAuth
//	apiserver-etcd-client.crt, .key           CN kube-apiserver-etcd-client, O system:masters; clientAuth
//
// (kubeadm 1.37 writes apiserver-etcd-client without an O; older releases
// put it in system:masters. etcd without auth enabled ignores both.)
func GenerateEtcdPKI(dir string, members []string) (*EtcdPKI, error) {
	ca, err := NewCertAuthority(EtcdCACommonName)
	if err != nil {
		return nil, fmt.Errorf("etcd CA: %w", err)
	}
	p := &EtcdPKI{CA: ca, CAPool: ca.Pool()}
	var (
		wg    sync.WaitGroup
		errMu sync.Mutex
		errs  []error
	)
	for _, name := range members {
		m := KubeadmEtcdMemberPKI(name, filepath.Join(dir, name))
		// kubeadm copies the CA to every control-plane node.
		if err := ca.Write(m.CAFile, m.CAKeyFile); err != nil {
			return nil, err
		}
		dns, ips := etcdAltNames(name)
		both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		for _, c := range []struct {
			what, cert, key string
			spec            CertSpec
		}{
			{"server", m.ServerCertFile, m.ServerKeyFile, CertSpec{CommonName: name, DNSNames: dns, IPs: ips, Usages: both}},
			{"peer", m.PeerCertFile, m.PeerKeyFile, CertSpec{CommonName: name, DNSNames: dns, IPs: ips, Usages: both}},
			{"healthcheck client", m.HealthcheckClientCertFile, m.HealthcheckClientKeyFile, CertSpec{CommonName: EtcdHealthcheckClientCommonName, Usages: client}},
			{"apiserver etcd client", m.APIServerEtcdClientCertFile, m.APIServerEtcdClientKeyFile,
				CertSpec{CommonName: APIServerEtcdClientCommonName, Organization: []string{APIServerEtcdClientOrganization}, Usages: client}},
		} {
			// RSA key generation dominates: issue the certificates in parallel.
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := ca.Issue(c.cert, c.key, c.spec); err != nil {
					errMu.Lock()
					errs = append(errs, fmt.Errorf("%s %s certificate: %w", name, c.what, err))
					errMu.Unlock()
				}
			}()
		}
		p.Members = append(p.Members, m)
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

// EtcdTLSArgs are the TLS flags kubeadm's etcd static pod passes
// (cmd/kubeadm/app/phases/etcd/local.go, getEtcdCommand), with this node's
// files.
func (m *EtcdMemberPKI) EtcdTLSArgs() []string {
	return []string{
		"--cert-file=" + m.ServerCertFile,
		"--key-file=" + m.ServerKeyFile,
		"--trusted-ca-file=" + m.CAFile,
		"--client-cert-auth=true",
		"--peer-cert-file=" + m.PeerCertFile,
		"--peer-key-file=" + m.PeerKeyFile,
		"--peer-trusted-ca-file=" + m.CAFile,
		"--peer-client-cert-auth=true",
	}
}

// ClientTLSConfig is a TLS client configuration that trusts the CA in
// caFile and presents the certificate in certFile/keyFile (both may be empty
// for no client certificate).
func ClientTLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s: no certificate", caFile)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
