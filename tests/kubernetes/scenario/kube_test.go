package scenario

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"

	"github.com/cairn-kv/cairn/tests/kubernetes/internal/controlplane"
)

// scenarioAPIServerArgs are the kube-apiserver flags the scenario adds to the
// ones controlplane.StartAPIServer always passes.
var scenarioAPIServerArgs = []string{
	// Compaction and event expiry fast enough for EventTTL and WatchCompacted410.
	"--etcd-compaction-interval=5s",
	"--event-ttl=10s",
	"--enable-priority-and-fairness=false",
	// podtemplates bypass the watch cache: their watches and lists go
	// straight to cairn (used for the compaction / 410 Gone check).
	"--watch-cache-sizes=podtemplates#0",
	"--allow-privileged=true",
}

// controlPlane is kube-apiserver, kube-controller-manager and kube-scheduler.
type controlPlane struct {
	apiserver      *controlplane.APIServer
	kcm, scheduler *controlplane.Proc
	restConfig     *rest.Config
}

func (cp *controlPlane) procs() []*controlplane.Proc {
	var out []*controlplane.Proc
	for _, p := range []*controlplane.Proc{cp.scheduler, cp.kcm} {
		if p != nil {
			out = append(out, p)
		}
	}
	if cp.apiserver != nil {
		out = append(out, cp.apiserver.Proc)
	}
	return out
}

func (cp *controlPlane) stop() {
	for _, p := range cp.procs() {
		p.Stop()
	}
}

// startControlPlane starts kube-apiserver on etcdURLs, waits for /readyz, then
// (with controllers) starts kube-controller-manager and kube-scheduler with an
// admin kubeconfig. With etcdTLS, kube-apiserver reaches etcdURLs (https) with
// that node's etcd CA and apiserver-etcd-client certificate, as kubeadm sets it
// up. The returned controlPlane holds whatever was started, also on error.
func startControlPlane(binDir, dir string, etcdURLs []string, p *controlplane.PKI, etcdTLS *controlplane.EtcdMemberPKI, controllers bool) (*controlPlane, error) {
	cp := &controlPlane{}
	cfg := controlplane.APIServerConfig{
		BinDir:       binDir,
		Dir:          dir,
		EtcdServers:  etcdURLs,
		PKI:          p,
		ExtraArgs:    scenarioAPIServerArgs,
		ReadyTimeout: 240 * time.Second,
	}
	if etcdTLS != nil {
		cfg.EtcdCAFile = etcdTLS.CAFile
		cfg.EtcdCertFile = etcdTLS.APIServerEtcdClientCertFile
		cfg.EtcdKeyFile = etcdTLS.APIServerEtcdClientKeyFile
	}
	api, err := controlplane.StartAPIServer(context.Background(), cfg)
	cp.apiserver = api
	if err != nil {
		return cp, err
	}
	cp.restConfig = api.RESTConfig()
	cp.restConfig.QPS = 200
	cp.restConfig.Burst = 400
	cp.restConfig.Timeout = 30 * time.Second
	if !controllers {
		return cp, nil
	}

	ports, err := freePorts(2)
	if err != nil {
		cp.stop()
		return cp, err
	}
	kubeconfig := filepath.Join(dir, "admin.kubeconfig")
	if err := p.WriteKubeconfig(kubeconfig, api.URL); err != nil {
		cp.stop()
		return cp, err
	}
	cp.kcm = &controlplane.Proc{
		Name:    "kube-controller-manager",
		Bin:     filepath.Join(binDir, "kube-controller-manager"),
		LogPath: filepath.Join(dir, "kube-controller-manager.log"),
		Args: []string{
			"--kubeconfig=" + kubeconfig,
			"--authentication-kubeconfig=" + kubeconfig,
			"--authorization-kubeconfig=" + kubeconfig,
			"--leader-elect=false",
			"--controllers=deployment,replicaset,serviceaccount,serviceaccount-token",
			"--service-account-private-key-file=" + p.SAKeyFile,
			"--root-ca-file=" + p.CAFile,
			"--use-service-account-credentials=false",
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", ports[0]),
			"--cert-dir=" + filepath.Join(dir, "kcm-certs"),
		},
	}
	cp.scheduler = &controlplane.Proc{
		Name:    "kube-scheduler",
		Bin:     filepath.Join(binDir, "kube-scheduler"),
		LogPath: filepath.Join(dir, "kube-scheduler.log"),
		Args: []string{
			"--kubeconfig=" + kubeconfig,
			"--authentication-kubeconfig=" + kubeconfig,
			"--authorization-kubeconfig=" + kubeconfig,
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", ports[1]),
			"--cert-dir=" + filepath.Join(dir, "scheduler-certs"),
		},
	}
	for _, pr := range []*controlplane.Proc{cp.kcm, cp.scheduler} {
		if err := pr.Start(); err != nil {
			cp.stop()
			return cp, err
		}
	}
	return cp, nil
}
