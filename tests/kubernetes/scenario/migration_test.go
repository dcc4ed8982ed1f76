package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/cairn-kv/cairn/tests/kubernetes/internal/controlplane"
)

// nsMove holds the objects that move from etcd to cairn.
const nsMove = "move"

// TestMoveFromEtcd moves a running kube-apiserver from a three-member etcd
// cluster to a three-member cairn cluster, by the procedure docs/migrate.md
// gives for a control plane that keeps running: stop the etcd members,
// restore the database with the highest revision on each cairn member, and
// start cairn on the same URLs. kube-apiserver is not
// restarted; its etcd client reconnects.
//
// After the move every object is there with its resourceVersion, a client's
// informer goes on watching without listing again, kube-apiserver's watch
// caches were not initialised again (its
// apiserver_watch_cache_initializations_total), and a new write reaches the
// informer.
func TestMoveFromEtcd(t *testing.T) {
	etcdBin, cairnBin, binDir := os.Getenv("ETCD_BIN"), os.Getenv("CAIRN_BIN"), os.Getenv("KUBE_BIN_DIR")
	if etcdBin == "" || cairnBin == "" || binDir == "" {
		t.Skip("ETCD_BIN, CAIRN_BIN and KUBE_BIN_DIR must all be set; see tests/kubernetes/README.md")
	}
	at := startAttached(t, etcdBin, binDir, "move", "etcd")
	etcd, api, kube := at.cluster, at.api, at.kube
	ctx := ctxT(t, 10*time.Minute)

	loadMoveHistory(ctx, t, kube)
	informer := startCountingInformer(ctx, t, kube)
	before := movedObjects(ctx, t, kube)
	initsBefore := watchCacheInits(ctx, t, api)

	// The move: every etcd member stops at once; the database with the highest
	// revision holds everything any member applied, so everything any client
	// was told.
	down := time.Now()
	var stopping sync.WaitGroup
	for _, m := range etcd.members {
		stopping.Go(m.Stop)
	}
	stopping.Wait()
	stopped := time.Now()
	db, newest := "", int64(-1)
	for _, m := range etcd.members {
		file := filepath.Join(m.dataDir, "member", "snap", "db")
		out, err := exec.Command(cairnBin, "snapshot", "status", file, "-w", "json").Output()
		if err != nil {
			t.Fatalf("cairn snapshot status %s: %v", file, err)
		}
		var status struct{ Revision int64 }
		if err := json.Unmarshal(out, &status); err != nil {
			t.Fatalf("cairn snapshot status %s: %v: %s", file, err, out)
		}
		t.Logf("%s's database: revision %d", m.name, status.Revision)
		if status.Revision > newest {
			db, newest = file, status.Revision
		}
	}
	cairn := etcd.successor(cairnBin, at.dir, "cairn")
	for _, m := range cairn.members {
		at.procs = append(at.procs, m.Proc)
		restore := exec.Command(cairnBin, "snapshot", "restore", db, "--skip-hash-check",
			"--name", m.name, "--data-dir", m.dataDir,
			"--initial-cluster", cairn.initialCluster(),
			"--initial-advertise-peer-urls", m.peerURL)
		if out, err := restore.CombinedOutput(); err != nil {
			t.Fatalf("cairn snapshot restore for %s: %v\n%s", m.name, err, out)
		}
	}
	restored := time.Now()
	if err := cairn.start(); err != nil {
		t.Fatalf("starting cairn: %v", err)
	}
	t.Logf("etcd stopped in %v, the newest database checked and restored on three members in %v, cairn healthy %v later",
		stopped.Sub(down).Round(time.Millisecond), restored.Sub(stopped).Round(time.Millisecond), time.Since(restored).Round(time.Millisecond))

	// kube-apiserver writes again once its etcd client has reconnected.
	var after *corev1.ConfigMap
	err := poll(2*time.Minute, 200*time.Millisecond, func() (bool, string, error) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-move"}, Data: map[string]string{"on": "cairn"}}
		created, err := kube.CoreV1().ConfigMaps(nsMove).Create(ctx, cm, metav1.CreateOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		after = created
		return true, "", nil
	})
	if err != nil {
		t.Fatalf("no write through kube-apiserver after the move: %v", err)
	}
	t.Logf("kube-apiserver wrote on cairn %v after etcd stopped, at resourceVersion %s", time.Since(down).Round(time.Millisecond), after.ResourceVersion)
	var last int64
	for _, rv := range before {
		last = max(last, rvInt(t, rv))
	}
	if rvInt(t, after.ResourceVersion) <= last {
		t.Errorf("the first write on cairn has resourceVersion %s, not after etcd's %d", after.ResourceVersion, last)
	}
	informer.await(t, "after-move")

	// Every object is there, unchanged.
	moved := movedObjects(ctx, t, kube)
	for key, rv := range before {
		if moved[key] != rv {
			t.Errorf("%s: resourceVersion %q after the move, %q before", key, moved[key], rv)
		}
	}
	if len(moved) != len(before)+1 || moved["configmaps/after-move"] != after.ResourceVersion {
		t.Errorf("%d objects after the move, %d before plus after-move: %v", len(moved), len(before), moved)
	}
	// No relist anywhere: the client's informer listed once, at its start,
	// and kube-apiserver initialised none of its watch caches again.
	if n := informer.lists.Load(); n != 1 {
		t.Errorf("the informer listed %d times; once expected (a relist after the move)", n)
	}
	initsAfter := watchCacheInits(ctx, t, api)
	for resource, n := range initsBefore {
		if initsAfter[resource] != n {
			t.Errorf("kube-apiserver's watch cache for %s was initialised %g times before the move, %g after", resource, n, initsAfter[resource])
		}
	}
	if got := len(informer.store.ListKeys()); got != countPrefix(moved, "configmaps/") {
		t.Errorf("the informer holds %d ConfigMaps, the API %d", got, countPrefix(moved, "configmaps/"))
	}
}

// loadMoveHistory creates nsMove with 200 ConfigMaps and 20 Secrets, updates
// every third ConfigMap and deletes every tenth.
func loadMoveHistory(ctx context.Context, t *testing.T, kube kubernetes.Interface) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsMove}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cms := kube.CoreV1().ConfigMaps(nsMove)
	for i := 0; i < 200; i++ {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)}, Data: map[string]string{"n": fmt.Sprint(i)}}
		created, err := cms.Create(ctx, cm, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			created.Data["updated"] = "yes"
			if _, err := cms.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 0; i < 200; i += 10 {
		if err := cms.Delete(ctx, fmt.Sprintf("cm-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 20; i++ {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("secret-%d", i)}, StringData: map[string]string{"k": "v"}}
		if _, err := kube.CoreV1().Secrets(nsMove).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// movedObjects lists nsMove's ConfigMaps and Secrets with a consistent read:
// "configmaps/<name>" or "secrets/<name>" to resourceVersion.
func movedObjects(ctx context.Context, t *testing.T, kube kubernetes.Interface) map[string]string {
	out := map[string]string{}
	cms, err := kube.CoreV1().ConfigMaps(nsMove).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range cms.Items {
		out["configmaps/"+o.Name] = o.ResourceVersion
	}
	secrets, err := kube.CoreV1().Secrets(nsMove).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range secrets.Items {
		out["secrets/"+o.Name] = o.ResourceVersion
	}
	return out
}

func countPrefix(m map[string]string, prefix string) int {
	n := 0
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// watchCacheInits is kube-apiserver's apiserver_watch_cache_initializations_total
// per resource (its label set).
func watchCacheInits(ctx context.Context, t *testing.T, api *controlplane.APIServer) map[string]float64 {
	code, body, err := api.Get(ctx, "/metrics")
	if err != nil || code != 200 {
		t.Fatalf("kube-apiserver /metrics: %d %v", code, err)
	}
	out := map[string]float64{}
	for _, l := range metricLines(body, "apiserver_watch_cache_initializations_total") {
		i := strings.LastIndex(l, " ")
		var v float64
		if _, err := fmt.Sscanf(l[i+1:], "%g", &v); err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		out[l[:i]] = v
	}
	if len(out) == 0 {
		t.Fatal("kube-apiserver reports no apiserver_watch_cache_initializations_total")
	}
	return out
}

// countingInformer is a client's informer on nsMove's ConfigMaps that counts
// its lists (a list call, or a watch asking for initial events) and passes on
// the names of the objects it sees added.
type countingInformer struct {
	lists atomic.Int32
	added chan string
	store cache.Store
}

func startCountingInformer(ctx context.Context, t *testing.T, kube kubernetes.Interface) *countingInformer {
	ci := &countingInformer{added: make(chan string, 1000)}
	cms := kube.CoreV1().ConfigMaps(nsMove)
	lw := &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			ci.lists.Add(1)
			return cms.List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				ci.lists.Add(1)
			}
			return cms.Watch(ctx, o)
		},
	}
	informer := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if cm, ok := obj.(*corev1.ConfigMap); ok {
				ci.added <- cm.Name
			}
		},
	}); err != nil {
		t.Fatal(err)
	}
	ci.store = informer.GetStore()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go informer.Run(stop)
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("the informer did not sync")
	}
	for len(ci.added) > 0 {
		<-ci.added
	}
	return ci
}

// await waits until the informer sees name added.
func (ci *countingInformer) await(t *testing.T, name string) {
	t.Helper()
	timeout := time.After(2 * time.Minute)
	var seen []string
	for {
		select {
		case got := <-ci.added:
			if got == name {
				return
			}
			seen = append(seen, got)
		case <-timeout:
			sort.Strings(seen)
			t.Fatalf("the informer never saw %s added (it saw %v)", name, seen)
		}
	}
}

// attached is a three-member cluster with kube-apiserver attached, in a
// temporary directory whose logs are kept when the test fails.
type attached struct {
	dir     string
	cluster *cairnCluster
	api     *controlplane.APIServer
	kube    kubernetes.Interface
	// procs are stopped at the test's end, the last first; a test adds the
	// processes it starts later.
	procs []*controlplane.Proc
}

// startAttached starts three members of bin (cairn or etcd), their logs and
// data dirs named after prefix, then kube-apiserver on them with its default
// flags, and a client with a QPS limit of 200. The directory is named after
// label. kube-apiserver compacts every 5 min, its default, as in production:
// the scenario's 5 s compacts so eagerly that a quiet resource's watch,
// resumed on another member after one stops, asks for a compacted revision,
// and its watch cache starts over even from etcd to etcd.
func startAttached(t *testing.T, bin, binDir, label, prefix string) *attached {
	t.Helper()
	dir, err := os.MkdirTemp("", "cairn-k8s-"+label+"-"+os.Getenv("KUBE_VERSION")+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("logs in %s", dir)
	at := &attached{dir: dir}
	t.Cleanup(func() {
		for i := len(at.procs) - 1; i >= 0; i-- {
			at.procs[i].Stop()
		}
		if t.Failed() || os.Getenv("SCENARIO_KEEP_LOGS") != "" {
			for _, p := range at.procs {
				t.Logf("--- %s, last 30 lines of %s ---\n%s", p.Name, p.LogPath, tailFile(p.LogPath, 30))
			}
			t.Logf("logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	if at.cluster, err = newCluster(bin, dir, prefix, nil); err != nil {
		t.Fatal(err)
	}
	for _, m := range at.cluster.members {
		at.procs = append(at.procs, m.Proc)
	}
	if err := at.cluster.start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	pki, err := controlplane.GeneratePKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	at.api, err = controlplane.StartAPIServer(context.Background(), controlplane.APIServerConfig{
		BinDir:       binDir,
		Dir:          dir,
		EtcdServers:  at.cluster.clientURLs(),
		PKI:          pki,
		ReadyTimeout: 240 * time.Second,
	})
	if at.api != nil {
		at.procs = append(at.procs, at.api.Proc)
	}
	if err != nil {
		t.Fatalf("starting kube-apiserver on %s: %v", bin, err)
	}
	rest := at.api.RESTConfig()
	rest.QPS, rest.Burst = 200, 400
	if at.kube, err = kubernetes.NewForConfig(rest); err != nil {
		t.Fatal(err)
	}
	return at
}
