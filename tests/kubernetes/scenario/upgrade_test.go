package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// TestRollingUpgrade upgrades a three-member cairn cluster from the previous
// release (CAIRN_PREVIOUS_BIN, built from tests/upgrade/PREVIOUS) to this
// build while kube-apiserver stays attached, as docs/operations.md tells an
// operator to: one member at a time (SIGTERM, the new binary, start, wait for
// /health), the leader last, its leadership moved first (the previous release
// does not hand it over as it stops). Then every member restarts once more on
// this build, the leader last, and this time it hands its leadership over
// itself. A client writes and reads ConfigMaps through kube-apiserver the
// whole time (paused only while the previous release's leadership moves), and
// an informer watches them.
//
// The checks: no request through kube-apiserver fails (no 5xx, nor any other
// error); the cluster version rises to this build's release line once every
// member runs it; the informer never lists again and kube-apiserver
// initialises none of its watch caches again
// (apiserver_watch_cache_initializations_total unchanged); every object
// written is there with its resourceVersion.
func TestRollingUpgrade(t *testing.T) {
	previousBin, cairnBin, binDir := os.Getenv("CAIRN_PREVIOUS_BIN"), os.Getenv("CAIRN_BIN"), os.Getenv("KUBE_BIN_DIR")
	if previousBin == "" || cairnBin == "" || binDir == "" {
		t.Skip("CAIRN_PREVIOUS_BIN, CAIRN_BIN and KUBE_BIN_DIR must all be set; see tests/kubernetes/README.md")
	}
	at := startAttached(t, previousBin, binDir, "upgrade", "cairn")
	cluster, api, kube := at.cluster, at.api, at.kube
	ctx := ctxT(t, 10*time.Minute)

	loadMoveHistory(ctx, t, kube)
	informer := startCountingInformer(ctx, t, kube)
	initsBefore := watchCacheInits(ctx, t, api)

	load := startUpgradeLoad(ctx, kube)
	// Followers first, the leader last; the order is fixed before the first
	// stop.
	leader, err := cluster.leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var followers []*cairnMember
	for i, m := range cluster.members {
		if i != leader {
			followers = append(followers, m)
		}
	}
	for _, m := range followers {
		swapMember(t, load, m, cairnBin)
	}
	// The previous release does not hand its leadership over as it stops
	// (from 0.2 on, a member does), and it drops the writes it is given while
	// it loses leadership. docs/operations.md tells an operator upgrading from
	// it to move the leadership to an upgraded member while writes are quiet;
	// so does this test, with the load paused for that step alone.
	load.pause()
	moveLeader(ctx, t, cluster, leader, followers[0])
	load.resume()
	swapMember(t, load, cluster.members[leader], cairnBin)

	// Every member on this build: a rolling restart under the load, the
	// leader last and not paused for. The leader hands its leadership over as
	// it stops, and the writes in flight carry over.
	leader, err = cluster.leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range cluster.members {
		if i != leader {
			swapMember(t, load, m, cairnBin)
		}
	}
	swapMember(t, load, cluster.members[leader], cairnBin)

	release, err := releaseLine(cluster.members[0])
	if err != nil {
		t.Fatal(err)
	}
	err = poll(time.Minute, 200*time.Millisecond, func() (bool, string, error) {
		var seen []string
		for _, m := range cluster.members {
			v, err := memberVersion(m)
			if err != nil {
				return false, err.Error(), nil
			}
			seen = append(seen, m.Name+": "+v.Cluster)
			if v.Cluster != release {
				return false, strings.Join(seen, ", "), nil
			}
		}
		return true, "", nil
	})
	if err != nil {
		t.Fatalf("the cluster version did not rise to %s: %v", release, err)
	}
	load.await(t, 20)
	written, failures, total := load.stop()
	// The request the stop cut short may still have been applied.
	delete(written, load.cutShort)
	t.Logf("%d requests through kube-apiserver during the upgrade and the restart, %d ConfigMaps written", total, len(written))
	for _, f := range failures {
		t.Errorf("a request through kube-apiserver failed during the upgrade: %s", f)
	}

	// A write after the upgrade reaches the informer, which never listed again.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-upgrade"}, Data: map[string]string{"on": release}}
	if _, err := kube.CoreV1().ConfigMaps(nsMove).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a write after the upgrade: %v", err)
	}
	informer.await(t, "after-upgrade")
	if n := informer.lists.Load(); n != 1 {
		t.Errorf("the informer listed %d times; once expected (a relist during the upgrade)", n)
	}
	initsAfter := watchCacheInits(ctx, t, api)
	for resource, n := range initsBefore {
		if initsAfter[resource] != n {
			t.Errorf("kube-apiserver's watch cache for %s was initialised %g times before the upgrade, %g after", resource, n, initsAfter[resource])
		}
	}
	// Every object the load wrote is there, at the resourceVersion it was
	// last written at.
	now := movedObjects(ctx, t, kube)
	for name, rv := range written {
		if got := now["configmaps/"+name]; got != rv {
			t.Errorf("configmaps/%s: resourceVersion %q after the upgrade, %q when last written", name, got, rv)
		}
	}
}

// swapMember stops m once the load has done 20 more requests, starts it on
// bin, and waits until it is healthy.
func swapMember(t *testing.T, load *upgradeLoad, m *cairnMember, bin string) {
	t.Helper()
	load.await(t, 20)
	started := time.Now()
	m.Stop()
	m.Bin = bin
	if err := m.Start(); err != nil {
		t.Fatalf("starting %s on %s: %v", m.Name, bin, err)
	}
	if err := m.waitHealthy(60 * time.Second); err != nil {
		t.Fatalf("%s on %s: %v", m.Name, bin, err)
	}
	t.Logf("%s runs %s, healthy %v after its stop", m.Name, bin, time.Since(started).Round(time.Millisecond))
}

// moveLeader moves the leadership from member from to member to, as
// `etcdctl move-leader` does, and waits until to leads.
func moveLeader(ctx context.Context, t *testing.T, c *cairnCluster, from int, to *cairnMember) {
	t.Helper()
	cli, err := c.etcdClient(c.members[from].clientURL)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	target, err := cli.Status(ctx, to.clientURL)
	if err != nil {
		t.Fatalf("status of %s: %v", to.Name, err)
	}
	if _, err := cli.MoveLeader(ctx, target.Header.MemberId); err != nil {
		t.Fatalf("moving the leadership to %s: %v", to.Name, err)
	}
	err = poll(30*time.Second, 50*time.Millisecond, func() (bool, string, error) {
		now, err := c.leader(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		return c.members[now] == to, fmt.Sprintf("%s leads", c.members[now].Name), nil
	})
	if err != nil {
		t.Fatalf("%s does not lead after the move: %v", to.Name, err)
	}
}

// upgradeLoad writes and reads ConfigMaps in nsMove through kube-apiserver
// from one goroutine until stopped: each step creates a ConfigMap, updates
// it, and reads it back.
type upgradeLoad struct {
	gate    sync.Mutex // held by each step, and by pause until resume
	mu      sync.Mutex
	written map[string]string // name: the resourceVersion last written
	// cutShort is the ConfigMap whose request the load's stop cut short: it
	// may have been written once more, unseen.
	cutShort string
	failures []string
	total    int
	progress chan struct{} // a token per request done
	cancel   context.CancelFunc
	done     chan struct{}
}

func startUpgradeLoad(ctx context.Context, kube kubernetes.Interface) *upgradeLoad {
	ctx, cancel := context.WithCancel(ctx)
	l := &upgradeLoad{written: map[string]string{}, progress: make(chan struct{}, 100000), cancel: cancel, done: make(chan struct{})}
	cms := kube.CoreV1().ConfigMaps(nsMove)
	go func() {
		defer close(l.done)
		for i := 0; ctx.Err() == nil; i++ {
			l.gate.Lock()
			l.step(ctx, cms, i)
			l.gate.Unlock()
		}
	}()
	return l
}

// step creates ConfigMap upgrade-i, updates it and reads it back.
func (l *upgradeLoad) step(ctx context.Context, cms corev1client.ConfigMapInterface, i int) {
	name := fmt.Sprintf("upgrade-%d", i)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"step": "created"}}, metav1.CreateOptions{})
	if !l.record(ctx, "create "+name, err) {
		return
	}
	l.wrote(name, cm.ResourceVersion)
	cm.Data["step"] = "updated"
	cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	if !l.record(ctx, "update "+name, err) {
		return
	}
	l.wrote(name, cm.ResourceVersion)
	got, err := cms.Get(ctx, name, metav1.GetOptions{})
	if !l.record(ctx, "get "+name, err) {
		return
	}
	if got.ResourceVersion != cm.ResourceVersion || got.Data["step"] != "updated" {
		l.fail(fmt.Sprintf("get %s: resourceVersion %s and step %q after the update wrote %s", name, got.ResourceVersion, got.Data["step"], cm.ResourceVersion))
	}
}

// pause lets the step in progress finish and starts no other until resume.
func (l *upgradeLoad) pause() { l.gate.Lock() }

func (l *upgradeLoad) resume() { l.gate.Unlock() }

func (l *upgradeLoad) wrote(name, rv string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.written[name] = rv
}

func (l *upgradeLoad) fail(what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures = append(l.failures, what)
}

// record counts a request and keeps its failure, with its HTTP status; it
// reports whether the request succeeded. A request cut short by the load's
// own stop is not a failure.
func (l *upgradeLoad) record(ctx context.Context, what string, err error) bool {
	l.mu.Lock()
	l.total++
	l.mu.Unlock()
	select {
	case l.progress <- struct{}{}:
	default:
	}
	if err == nil {
		return true
	}
	if ctx.Err() != nil {
		l.mu.Lock()
		l.cutShort = strings.Fields(what)[1]
		l.mu.Unlock()
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		l.fail(fmt.Sprintf("%s: HTTP %d: %v", what, status.Status().Code, err))
	} else {
		l.fail(fmt.Sprintf("%s: %v", what, err))
	}
	return false
}

// await waits until n more requests are done.
func (l *upgradeLoad) await(t *testing.T, n int) {
	t.Helper()
	for len(l.progress) > 0 {
		<-l.progress
	}
	timeout := time.After(time.Minute)
	for i := 0; i < n; i++ {
		select {
		case <-l.progress:
		case <-timeout:
			t.Fatalf("the load did %d requests in a minute; %d expected", i, n)
		}
	}
}

// stop ends the load and returns what it wrote, its failures and how many
// requests it made.
func (l *upgradeLoad) stop() (map[string]string, []string, int) {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.written, l.failures, l.total
}

// cairnVersion is the part of a member's /version that names cairn's versions.
type cairnVersion struct {
	Release string `json:"cairn"`
	Cluster string `json:"cairncluster"`
}

func memberVersion(m *cairnMember) (cairnVersion, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(m.httpURL() + "/version")
	if err != nil {
		return cairnVersion{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return cairnVersion{}, err
	}
	var v cairnVersion
	if err := json.Unmarshal(body, &v); err != nil {
		return cairnVersion{}, fmt.Errorf("%s /version: %v: %s", m.Name, err, body)
	}
	return v, nil
}

// releaseLine is the major.minor of the release m runs: the cluster version
// the members agree once all of them run it.
func releaseLine(m *cairnMember) (string, error) {
	v, err := memberVersion(m)
	if err != nil {
		return "", err
	}
	parts := strings.SplitN(v.Release, ".", 3)
	if len(parts) < 2 {
		return "", fmt.Errorf("%s: release %q in /version is not major.minor.patch", m.Name, v.Release)
	}
	return parts[0] + "." + parts[1], nil
}
