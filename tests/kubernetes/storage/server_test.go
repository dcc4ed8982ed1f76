package storage

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-kv/cairn/tests/kubernetes/internal/loopback"
)

// Environment variables understood by this package (see README.md).
const (
	envTarget       = "STORAGE_TARGET"        // cairn | etcd
	envCairnBin     = "CAIRN_BIN"             // default <repo>/target/debug/cairn
	envEtcdBin      = "ETCD_BIN"              // default <repo>/target/etcd-3.7/etcd
	envResults      = "STORAGE_RESULTS"       // results file: name<TAB>pass|fail|skip
	envServerFlags  = "STORAGE_SERVER_FLAGS"  // extra flags for every server started
	envProgressFlag = "STORAGE_PROGRESS_FLAG" // flag giving a 1s progress-notify interval
)

// defaultProgressFlag is etcd's flag for the watch progress-notify interval; the
// ProgressNotify / WatchDispatchBookmarkEvents subtests run against a dedicated
// server started with it (like the etcd3 package's own tests, which use an
// embedded etcd with WatchProgressNotifyInterval = 1s).
const defaultProgressFlag = "--watch-progress-notify-interval=1s"

// serverProcess is one single-member server (cairn or etcd) run as a child
// process on free loopback ports with a temporary data dir.
type serverProcess struct {
	target    string
	clientURL string
	logPath   string
	cmd       *exec.Cmd
	exited    chan struct{}
	waitErr   error
}

func repoRoot() string {
	wd, err := os.Getwd() // <repo>/tests/kubernetes/storage when run by go test
	if err != nil {
		return "."
	}
	return filepath.Clean(filepath.Join(wd, "..", "..", ".."))
}

// targetBinary returns the target name and the binary to run, or skips the test.
func targetBinary(t testing.TB) (string, string) {
	target := os.Getenv(envTarget)
	var bin string
	switch target {
	case "cairn":
		bin = os.Getenv(envCairnBin)
		if bin == "" {
			bin = filepath.Join(repoRoot(), "target", "debug", "cairn")
		}
	case "etcd":
		bin = os.Getenv(envEtcdBin)
		if bin == "" {
			bin = filepath.Join(repoRoot(), "target", "etcd-3.7", "etcd")
		}
	case "":
		t.Skipf("%s is not set (cairn|etcd): nothing to test against", envTarget)
	default:
		t.Fatalf("%s=%q: want cairn or etcd", envTarget, target)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s binary %q: %v", target, bin, err)
	}
	return target, bin
}

// freePorts: see loopback.FreePorts.
var freePorts = loopback.FreePorts

// startServer starts a fresh server and waits until GET /health says healthy.
// The process is killed in owner's cleanup. A start that fails (e.g. a port
// taken between picking and binding) is retried twice on new ports.
func startServer(owner testing.TB, target, bin string, extraFlags ...string) (*serverProcess, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		s, err := tryStartServer(owner, target, bin, extraFlags)
		if err == nil {
			owner.Cleanup(s.stop)
			return s, nil
		}
		lastErr = err
		if s := err.Error(); strings.Contains(s, "unexpected argument") || strings.Contains(s, "unknown flag") ||
			strings.Contains(s, "flag provided but not defined") {
			break // the server rejects a flag: retrying will not help
		}
	}
	return nil, fmt.Errorf("starting %s: %w", target, lastErr)
}

func tryStartServer(t testing.TB, target, bin string, extraFlags []string) (*serverProcess, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "k8s-storage-"+target+"-")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	dataDir := filepath.Join(dir, "data")
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	args := []string{
		"--name", "default",
		"--data-dir", dataDir,
		"--listen-client-urls", clientURL,
		"--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default=" + peerURL,
	}
	args = append(args, strings.Fields(os.Getenv(envServerFlags))...)
	args = append(args, extraFlags...)

	logPath := filepath.Join(dir, "server.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Kill the server if the test binary dies without running cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	s := &serverProcess{target: target, clientURL: clientURL, logPath: logPath, cmd: cmd, exited: make(chan struct{})}
	go func() {
		s.waitErr = cmd.Wait()
		logFile.Close()
		close(s.exited)
	}()
	if err := s.waitHealthy(60 * time.Second); err != nil {
		s.stop()
		return nil, fmt.Errorf("%s %s: %w\n--- server log (tail) ---\n%s", bin, strings.Join(args, " "), err, s.logTail(40))
	}
	t.Logf("%s started: pid %d, client %s, log %s", target, cmd.Process.Pid, clientURL, logPath)
	return s, nil
}

func (s *serverProcess) waitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: 2 * time.Second}
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return fmt.Errorf("server exited before becoming healthy: %v", s.waitErr)
		default:
		}
		resp, err := client.Get(s.clientURL + "/health")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var h struct {
				Health string `json:"health"`
			}
			if resp.StatusCode == http.StatusOK && json.Unmarshal(body, &h) == nil && h.Health == "true" {
				return nil
			}
			last = fmt.Sprintf("GET /health: %d %s", resp.StatusCode, bytes.TrimSpace(body))
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not healthy after %v (last: %s)", timeout, last)
}

// alive reports whether the process is still running.
func (s *serverProcess) alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

func (s *serverProcess) stop() {
	if !s.alive() {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

func (s *serverProcess) logTail(n int) string {
	data, err := os.ReadFile(s.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
