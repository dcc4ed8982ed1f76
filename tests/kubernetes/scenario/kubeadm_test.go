package scenario

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/kubernetes/pkg/probe"
	httpprobe "k8s.io/kubernetes/pkg/probe/http"

	"github.com/cairn-kv/cairn/tests/kubernetes/internal/controlplane"
)

// TestKubeadmManifest runs cairn from the etcd static-pod manifest that
// kubeadm writes for a local (stacked) etcd, and the scenario's
// single-member steps against kube-apiserver on it:
//
//  1. kubeadm (KUBE_BIN_DIR/kubeadm) writes, from a v1beta4
//     InitConfiguration and ClusterConfiguration, the etcd CA and the etcd
//     server, peer, healthcheck-client and apiserver-etcd-client
//     certificates (`kubeadm init phase certs ...`) and the manifest
//     (`kubeadm init phase etcd local`), all in the test's dir.
//  2. The manifest's etcd container command runs unchanged, with `etcd` on
//     the container's PATH being a symlink to CAIRN_BIN, as the kubelet would
//     start the static pod: argv[0] "etcd", the container's environment, the
//     hostPath volumes created, then the startup probe until it passes.
//  3. kube-apiserver, kube-controller-manager and kube-scheduler start on it,
//     kube-apiserver with kubeadm's apiserver-etcd-client certificate.
//
// See ../README.md for why the advertise address is not 127.0.0.1 and which
// flags the configuration sets.
func TestKubeadmManifest(t *testing.T) {
	cairnBin, binDir := requireBinaries(t)
	kubeadmBin := filepath.Join(binDir, "kubeadm")
	if _, err := os.Stat(kubeadmBin); err != nil {
		t.Skipf("no kubeadm in KUBE_BIN_DIR (%v); run.sh builds it for the releases in KUBEADM_VERSIONS", err)
	}
	h := newHarness(t, "cairn-k8s-kubeadm-")
	k := setUpKubeadmNode(t, h.dir, kubeadmBin, cairnBin)
	h.kubeadm = k
	// kubeadm's PKI as the mTLS steps read it: one node, one member.
	h.etcdPKI = &controlplane.EtcdPKI{Members: []*controlplane.EtcdMemberPKI{k.pki}}
	clientTLS, err := controlplane.ClientTLSConfig(k.pki.CAFile, k.pki.HealthcheckClientCertFile, k.pki.HealthcheckClientKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	h.cairn = &cairnCluster{members: []*cairnMember{k.member}, clientTLS: clientTLS}

	start := time.Now()
	if err := k.member.Start(); err != nil {
		t.Fatal(err)
	}
	if err := k.waitStarted(); err != nil {
		t.Fatalf("the manifest's etcd (cairn) did not start: %v%s", err, h.logTails(40))
	}
	t.Logf("startup probe passed %v after the start", time.Since(start).Round(time.Millisecond))
	h.startKube(t, binDir, k.pki, true)

	h.runSteps(t, []step{
		{"ManifestProbes", testManifestProbes},
		{"KubeadmProbes", testKubeadmProbes},
		{"MemberTLS", testMemberTLS},
		{"Namespaces", testNamespaces},
		{"Paging500ConfigMaps", testPaging},
		{"OptimisticConcurrency", testConflicts},
		{"CRDStatusSubresource", testCRD},
		{"LeaseRenewals", testLease},
		{"EventTTL", testEvents},
		{"Watches", testWatches},
		{"WatchCompacted410", testCompaction},
		{"ListResourceVersionSemantics", testLists},
		{"WatchList", testWatchList},
		{"ConsistentListFromCache", testConsistentReadMetric},
		{"RangeStream", testRangeStream},
		{"StaticPodRestart", testStaticPodRestart},
		{"NodesAndDeployment", testDeployment},
	})
}

// kubeadmNodeName is the node's (and so the etcd member's) name.
const kubeadmNodeName = "kubeadm-node"

// kubeadmAdvertiseAddress is the InitConfiguration's
// localAPIEndpoint.advertiseAddress: 192.0.2.10, from TEST-NET-1 (RFC 5737),
// on no interface, so nothing can reach it. kubeadm refuses 127.0.0.1 there
// unless the lo interface also has a global unicast address
// (SetAPIEndpointDynamicDefaults: "unable to select an IP from lo network
// interface"). The address ends up only in the server and peer
// certificates' SANs and in the pod's etcd.advertise-client-urls
// annotation: every URL of the etcd command is set to 127.0.0.1 through
// etcd.local.extraArgs, and the test checks that.
const kubeadmAdvertiseAddress = "192.0.2.10"

// containerPath is the PATH a container gets when its image sets none
// (containerd's and the OCI runtimes' default). The test's bin dir, holding
// `etcd`, goes before it.
const containerPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// kubeadmNode is a control-plane node as kubeadm set it up: its certificates,
// the etcd static pod it wrote, and cairn running that pod's command.
type kubeadmNode struct {
	dir          string // the node's files: kubeadm.yaml, pki/, etcd-data/, manifests/, bin/
	configPath   string
	manifestPath string
	pod          *corev1.Pod
	container    corev1.Container // the etcd container
	pki          *controlplane.EtcdMemberPKI
	member       *cairnMember // cairn, started from the container's command
	prober       httpprobe.Prober
}

// setUpKubeadmNode writes kubeadm's configuration under dir, runs kubeadm's
// certificate and etcd phases, reads the manifest and prepares (without
// starting) cairnBin, as `etcd`, from the etcd container's command. It fails
// t if kubeadm fails, if the command has a URL off 127.0.0.1 or a path
// outside dir, or if anything kubeadm wrote landed under /etc/kubernetes.
func setUpKubeadmNode(t *testing.T, dir, kubeadmBin, cairnBin string) *kubeadmNode {
	k := &kubeadmNode{
		dir:          dir,
		configPath:   filepath.Join(dir, "kubeadm.yaml"),
		manifestPath: filepath.Join(dir, "manifests", "etcd.yaml"),
		prober:       httpprobe.New(false), // the kubelet's: no redirects to other hosts
	}
	certDir := filepath.Join(dir, "pki")
	k.pki = controlplane.KubeadmEtcdMemberPKI(kubeadmNodeName, certDir)
	ports, err := freePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	clientURL := fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("https://127.0.0.1:%d", ports[1])
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d", ports[2])
	config := kubeadmConfig(certDir, filepath.Join(dir, "etcd-data"), clientURL, peerURL, metricsURL)
	if err := os.WriteFile(k.configPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("kubeadm configuration %s:\n%s", k.configPath, config)

	// kubeadm runs as this user (root on CI): make sure nothing lands in the
	// machine's /etc/kubernetes, and take away whatever does.
	before, err := listTree("/etc/kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		after, err := listTree("/etc/kubernetes")
		if err != nil {
			t.Error(err)
		}
		var added []string
		for p := range after {
			if !before[p] {
				added = append(added, p)
			}
		}
		sort.Strings(added)
		for _, p := range added {
			os.RemoveAll(p)
		}
		if len(added) > 0 {
			t.Errorf("kubeadm wrote under /etc/kubernetes (removed again): %v", added)
		}
	}()

	start := time.Now()
	log := filepath.Join(dir, "kubeadm.log")
	for _, phase := range []string{"etcd-ca", "etcd-server", "etcd-peer", "etcd-healthcheck-client", "apiserver-etcd-client"} {
		runKubeadm(t, kubeadmBin, log, nil, "init", "phase", "certs", phase, "--config", k.configPath)
	}
	// The etcd phase writes to /etc/kubernetes/manifests and has no flag for
	// another dir. With --dry-run it writes the same manifest to its dry-run
	// dir instead, KUBEADM_INIT_DRYRUN_DIR (else a new dir under
	// /etc/kubernetes/tmp), and leaves the data dir to be created.
	runKubeadm(t, kubeadmBin, log, []string{"KUBEADM_INIT_DRYRUN_DIR=" + filepath.Dir(k.manifestPath)},
		"init", "phase", "etcd", "local", "--config", k.configPath, "--dry-run")
	t.Logf("kubeadm's 6 phases took %v (log %s)", time.Since(start).Round(time.Millisecond), log)

	k.readManifest(t)
	argv := append(append([]string{}, k.container.Command...), k.container.Args...)
	t.Logf("the manifest's etcd command:\n%s", strings.Join(argv, " \\\n    "))
	if err := checkCommand(argv, k.container, dir); err != nil {
		t.Fatal(err)
	}
	if a := k.pod.Annotations["kubeadm.kubernetes.io/etcd.advertise-client-urls"]; a != "" {
		t.Logf("annotation kubeadm.kubernetes.io/etcd.advertise-client-urls: %s (not used: the command advertises %s)", a, clientURL)
	}

	// What the kubelet does before it starts the container: create the
	// DirectoryOrCreate hostPath volumes (kubeadm init itself would have made
	// the data dir, mode 0700, in this phase without --dry-run).
	for _, v := range k.pod.Spec.Volumes {
		if v.HostPath == nil {
			t.Fatalf("volume %s is not a hostPath", v.Name)
		}
		mode := os.FileMode(0o755)
		if v.HostPath.Path == filepath.Join(dir, "etcd-data") {
			mode = 0o700
		}
		if err := os.MkdirAll(v.HostPath.Path, mode); err != nil {
			t.Fatal(err)
		}
	}
	// `etcd` on the container's PATH is cairn.
	binDir := filepath.Join(dir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	absCairn, err := filepath.Abs(cairnBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(absCairn, filepath.Join(binDir, "etcd")); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + binDir + ":" + containerPath}
	for _, e := range k.container.Env {
		if e.ValueFrom != nil {
			t.Fatalf("container env %s uses valueFrom, which the test does not resolve", e.Name)
		}
		env = append(env, e.Name+"="+e.Value)
	}
	bin, err := lookPathIn(argv[0], binDir+":"+containerPath)
	if err != nil {
		t.Fatal(err)
	}
	if bin != filepath.Join(binDir, "etcd") {
		t.Fatalf("%q on the container's PATH is %s, not the symlink to cairn", argv[0], bin)
	}
	if out, err := exec.Command(bin, "--version").CombinedOutput(); err != nil {
		t.Logf("etcd --version (cairn): %v: %s", err, strings.TrimSpace(string(out)))
	} else {
		t.Logf("etcd --version (cairn): %s", strings.TrimSpace(string(out)))
	}

	k.member = &cairnMember{
		Proc: &controlplane.Proc{
			Name:    "etcd-" + kubeadmNodeName,
			Bin:     bin,
			Argv0:   argv[0],
			Args:    argv[1:],
			Env:     env,
			LogPath: filepath.Join(dir, "etcd-"+kubeadmNodeName+".log"),
		},
		name:       kubeadmNodeName,
		dataDir:    flagValue(argv, "data-dir"),
		clientURL:  firstURL(flagValue(argv, "advertise-client-urls")),
		peerURL:    firstURL(flagValue(argv, "initial-advertise-peer-urls")),
		metricsURL: firstURL(flagValue(argv, "listen-metrics-urls")),
		pki:        k.pki,
	}
	return k
}

// kubeadmConfig is the kubeadm v1beta4 configuration of a node named
// kubeadmNodeName whose certificates go to certDir and whose local etcd keeps
// its data in dataDir. etcd.local.extraArgs replace (kubeadm drops the
// default and appends the extra argument) every URL flag of kubeadm's etcd
// command, to put them on 127.0.0.1 and on free ports instead of the
// advertise address and 2379, 2380 and 2381. The probes follow
// listen-metrics-urls. kubernetesVersion is set so that kubeadm does not
// look up the latest release on the network, and criSocket so that it does
// not look for a container runtime.
func kubeadmConfig(certDir, dataDir, clientURL, peerURL, metricsURL string) string {
	return fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: %s
  bindPort: 6443
nodeRegistration:
  name: %s
  criSocket: unix:///var/run/containerd/containerd.sock
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.37.2
certificatesDir: %s
etcd:
  local:
    dataDir: %s
    extraArgs:
    # kubeadm: https://127.0.0.1:2379,https://<advertise address>:2379; here both are 127.0.0.1
    - name: listen-client-urls
      value: %s
    - name: advertise-client-urls
      value: %s
    - name: listen-peer-urls
      value: %s
    - name: initial-advertise-peer-urls
      value: %s
    - name: initial-cluster
      value: %s=%s
    - name: listen-metrics-urls
      value: %s
`, kubeadmAdvertiseAddress, kubeadmNodeName, certDir, dataDir,
		clientURL, clientURL, peerURL, peerURL, kubeadmNodeName, peerURL, metricsURL)
}

// runKubeadm runs kubeadm with args (and env added to this process's
// environment), appends its output to log, and fails t if it fails.
func runKubeadm(t *testing.T, bin, log string, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	f, ferr := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if ferr == nil {
		fmt.Fprintf(f, "=== %s kubeadm %s\n%s", strings.Join(env, " "), strings.Join(args, " "), out)
		f.Close()
	}
	if err != nil {
		t.Fatalf("kubeadm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// readManifest decodes the static pod kubeadm wrote and finds its etcd
// container.
func (k *kubeadmNode) readManifest(t *testing.T) {
	data, err := os.ReadFile(k.manifestPath)
	if err != nil {
		t.Fatalf("kubeadm's etcd manifest: %v", err)
	}
	obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		t.Fatalf("decoding %s: %v", k.manifestPath, err)
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		t.Fatalf("%s holds a %v, not a Pod", k.manifestPath, gvk)
	}
	k.pod = pod
	for _, c := range pod.Spec.Containers {
		if c.Name == "etcd" {
			k.container = c
		}
	}
	if k.container.Name == "" || len(k.container.Command) == 0 {
		t.Fatalf("%s: no etcd container with a command", k.manifestPath)
	}
	if !pod.Spec.HostNetwork {
		t.Fatalf("%s: the pod does not use the host network, so its URLs are not this machine's", k.manifestPath)
	}
}

// checkCommand checks that every URL in the command's --flag=value arguments
// (comma-separated lists and name=URL pairs included) is on 127.0.0.1, that
// the probes go to 127.0.0.1 too, and that every absolute path the command
// names is inside dir.
func checkCommand(argv []string, c corev1.Container, dir string) error {
	var bad []string
	for _, a := range argv[1:] {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok || !strings.HasPrefix(a, "--") {
			bad = append(bad, fmt.Sprintf("argument %q is not --flag=value", a))
			continue
		}
		for _, item := range strings.Split(value, ",") {
			if i := strings.Index(item, "://"); i > 0 {
				if j := strings.LastIndex(item[:i], "="); j >= 0 {
					item = item[j+1:] // initial-cluster's name=URL
				}
				u, err := url.Parse(item)
				if err != nil || u.Hostname() != "127.0.0.1" {
					bad = append(bad, fmt.Sprintf("--%s: %s is not on 127.0.0.1", name, item))
				}
			} else if filepath.IsAbs(item) && !strings.HasPrefix(item, dir+string(filepath.Separator)) {
				bad = append(bad, fmt.Sprintf("--%s: %s is outside the test's dir %s", name, item, dir))
			}
		}
	}
	for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		switch {
		case p == nil:
			bad = append(bad, what+" probe: none")
		case p.HTTPGet == nil:
			bad = append(bad, what+" probe: not an HTTP GET")
		case p.HTTPGet.Host != "127.0.0.1":
			bad = append(bad, fmt.Sprintf("%s probe: host %q, not 127.0.0.1", what, p.HTTPGet.Host))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("the manifest's etcd container does not stay on loopback and in the test's dir:\n  %s", strings.Join(bad, "\n  "))
	}
	return nil
}

// flagValue is the value of the last --name=value in argv ("" if none).
func flagValue(argv []string, name string) string {
	v := ""
	for _, a := range argv {
		if s, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			v = s
		}
	}
	return v
}

func firstURL(list string) string {
	first, _, _ := strings.Cut(list, ",")
	return first
}

// lookPathIn finds name as exec.LookPath does, but on the PATH path.
func lookPathIn(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found on PATH %s", name, path)
}

// listTree is the set of paths under root, root included (empty if root does
// not exist).
func listTree(root string) (map[string]bool, error) {
	out := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			if p == root && os.IsNotExist(err) {
				return nil
			}
			return err
		}
		out[p] = true
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("listing %s: %w", root, err)
	}
	return out, nil
}

// ------------------------------------------------------------------ probes

// probe runs p, one of the etcd container's probes, once as the kubelet's
// prober does (pkg/kubelet/prober.runProbe): the request from
// NewRequestForHTTPGetAction (named port resolved on the container, the
// kubelet's User-Agent and Accept headers), sent with the probe's
// timeoutSeconds by pkg/probe/http's prober (TLS not verified, no redirect
// to another host, no keep-alive). Success and Warning pass. The pod IP only
// stands in for an empty host, and the manifest's host is 127.0.0.1.
func (k *kubeadmNode) probe(p *corev1.Probe) (bool, string) {
	req, err := httpprobe.NewRequestForHTTPGetAction(p.HTTPGet, &k.container, "127.0.0.1", "probe")
	if err != nil {
		return false, err.Error()
	}
	result, output, err := k.prober.Probe(req, time.Duration(p.TimeoutSeconds)*time.Second)
	what := fmt.Sprintf("GET %s: %s", req.URL, result)
	if err != nil {
		return false, fmt.Sprintf("%s: %v", what, err)
	}
	if output != "" {
		what += " " + strings.TrimSpace(output)
	}
	return result == probe.Success || result == probe.Warning, what
}

// waitStarted waits for the startup probe to pass, within the kubelet's
// budget for it (initialDelaySeconds + failureThreshold × periodSeconds,
// 250 s for kubeadm's). The kubelet first probes after initialDelaySeconds
// and then every periodSeconds (10 s each); this polls every 250 ms, which
// only makes the wait shorter. It gives up at once if the process exits.
func (k *kubeadmNode) waitStarted() error {
	p := k.container.StartupProbe
	budget := time.Duration(p.InitialDelaySeconds+p.FailureThreshold*p.PeriodSeconds) * time.Second
	return poll(budget, 250*time.Millisecond, func() (bool, string, error) {
		if !k.member.Alive() {
			return false, "", fmt.Errorf("exited before the startup probe passed: %v", k.member.ExitErr())
		}
		ok, why := k.probe(p)
		return ok, why, nil
	})
}

// testManifestProbes runs the manifest's liveness, readiness and startup
// probes once each, as the kubelet does; each must pass.
func testManifestProbes(t *testing.T, h *harness) {
	k := h.kubeadm
	for _, c := range []struct {
		what string
		p    *corev1.Probe
	}{{"liveness", k.container.LivenessProbe}, {"readiness", k.container.ReadinessProbe}, {"startup", k.container.StartupProbe}} {
		ok, why := k.probe(c.p)
		if !ok {
			t.Errorf("%s probe fails (the kubelet would %s): %s", c.what, map[string]string{
				"liveness": "restart the container", "readiness": "mark the pod not ready", "startup": "restart the container",
			}[c.what], why)
			continue
		}
		t.Logf("%s probe (timeout %ds, period %ds, failureThreshold %d): %s", c.what, c.p.TimeoutSeconds, c.p.PeriodSeconds, c.p.FailureThreshold, why)
	}
}

// testStaticPodRestart restarts the etcd container as the kubelet does when
// its manifest changes or its liveness probe fails: SIGTERM (then SIGKILL),
// and the same command again on the same data dir, waiting for the startup
// probe. kube-apiserver's etcd client must reconnect on its own: a ConfigMap
// written before is still there with its resourceVersion, and a new one can
// be created with a higher one.
func testStaticPodRestart(t *testing.T, h *harness) {
	ctx := ctxT(t, 4*time.Minute)
	cms := h.kube.CoreV1().ConfigMaps(nsBasic)
	before, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before-restart"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create before the restart: %v", err)
	}
	m := h.kubeadm.member
	start := time.Now()
	m.Stop()
	t.Logf("stopped (SIGTERM) in %v, exit: %v", time.Since(start).Round(time.Millisecond), m.ExitErr())
	start = time.Now()
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	if err := h.kubeadm.waitStarted(); err != nil {
		t.Fatalf("after the restart: %v\n%s", err, tailFile(m.LogPath, 30))
	}
	t.Logf("startup probe passed %v after the restart", time.Since(start).Round(time.Millisecond))

	var after *corev1.ConfigMap
	err = poll(60*time.Second, 500*time.Millisecond, func() (bool, string, error) {
		cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-restart"}}, metav1.CreateOptions{})
		if err != nil {
			if cm, gerr := cms.Get(ctx, "after-restart", metav1.GetOptions{}); gerr == nil {
				after = cm // an earlier attempt went through
				return true, "", nil
			}
			return false, err.Error(), nil
		}
		after = cm
		return true, "", nil
	})
	if err != nil {
		t.Fatalf("kube-apiserver cannot write after the restart: %v", err)
	}
	t.Logf("kube-apiserver wrote again %v after the restart", time.Since(start).Round(time.Millisecond))
	got, err := cms.Get(ctx, "before-restart", metav1.GetOptions{})
	switch {
	case err != nil:
		t.Errorf("get the ConfigMap written before the restart: %v", err)
	case got.ResourceVersion != before.ResourceVersion || got.Data["k"] != "v":
		t.Errorf("ConfigMap written before the restart: RV %s data %v, want RV %s data map[k:v]", got.ResourceVersion, got.Data, before.ResourceVersion)
	}
	if rvInt(t, after.ResourceVersion) <= rvInt(t, before.ResourceVersion) {
		t.Errorf("ConfigMap created after the restart has RV %s, not above %s from before", after.ResourceVersion, before.ResourceVersion)
	}
}
