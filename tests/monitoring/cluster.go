// Three members of one target (etcd 3.7.3 or cairn), started with the same etcd flags, each
// behind a delaying proxy on its advertised peer URL and, as root, with its data directory on
// a disk of its own that the harness can stall.
//
// The disk: an ext4 file system on a loop device whose image lies on a second ext4 file
// system, itself on a loop device. Freezing the outer one (fsfreeze) stalls every block the
// inner one sends to its device, and nothing else: the member's writes still land in the page
// cache at once, its fsyncs wait until the thaw. Freezing the member's own file system would
// block its write() calls instead, which etcd does not count as fsync time.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

const quotaBytes = 32 << 20

type member struct {
	name      string
	clientURL string
	peerURL   string // what it listens on
	proxyURL  string // what it advertises, the proxy in front of peerURL
	dataDir   string
	mount     string // the file system holding dataDir, "" when not on one of its own
	outer     string // the file system holding mount's image: freeze it to stall the disk
	logPath   string
	proxy     *delayProxy
	cli       *clientv3.Client // to this member only
	cmd       *exec.Cmd
	done      chan struct{}
}

type cluster struct {
	bin     string
	dir     string
	members []*member
	initial string
}

// freePorts reserves n loopback ports by binding and releasing them.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newCluster lays out three members; with ownDisks each data directory is a mounted image.
func newCluster(bin, dir string, ports []int, ownDisks bool) (*cluster, error) {
	c := &cluster{bin: bin, dir: dir}
	var initial []string
	for i := 0; i < 3; i++ {
		m := &member{
			name:      fmt.Sprintf("m%d", i+1),
			clientURL: fmt.Sprintf("http://127.0.0.1:%d", ports[3*i]),
			peerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[3*i+1]),
			proxyURL:  fmt.Sprintf("http://127.0.0.1:%d", ports[3*i+2]),
		}
		m.logPath = filepath.Join(dir, m.name+".log")
		m.dataDir = filepath.Join(dir, m.name+".data")
		c.members = append(c.members, m)
		if ownDisks {
			outer := filepath.Join(dir, m.name+".outer")
			if err := mountImage(filepath.Join(dir, m.name+".img"), "1536M", outer); err != nil {
				return c, err
			}
			m.outer = outer
			inner := filepath.Join(dir, m.name+".fs")
			if err := mountImage(filepath.Join(outer, "disk.img"), "1G", inner); err != nil {
				return c, err
			}
			m.mount = inner
			m.dataDir = filepath.Join(inner, "data")
		}
		p, err := newDelayProxy(strings.TrimPrefix(m.proxyURL, "http://"), strings.TrimPrefix(m.peerURL, "http://"))
		if err != nil {
			return c, err
		}
		m.proxy = p
		cli, err := clientv3.New(clientv3.Config{
			Endpoints:   []string{m.clientURL},
			DialTimeout: 2 * time.Second,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			return c, err
		}
		m.cli = cli
		initial = append(initial, m.name+"="+m.proxyURL)
	}
	c.initial = strings.Join(initial, ",")
	return c, nil
}

// mountImage makes a sparse ext4 image and mounts it on a loop device (released at umount).
func mountImage(img, size, at string) error {
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	if err := run("truncate", "-s", size, img); err != nil {
		return err
	}
	if err := run("mkfs.ext4", "-q", "-F", img); err != nil {
		return err
	}
	// noinit_itable: no background zeroing of inode tables after the mount, whose writes
	// would slow the members' first fsyncs.
	return run("mount", "-o", "loop,noinit_itable", img, at)
}

// stallDisk freezes the file system under m's disk for on, thaws it for off, rounds times:
// a disk that hardly moves. An fsync issued in a round waits until its thaw. Several rounds,
// because a member may spend one whole stall blocked elsewhere (a write waiting on the
// journal), and then its next fsync lands in the next round.
func (m *member) stallDisk(ctx context.Context, rounds int, on, off time.Duration) error {
	for i := 0; i < rounds; i++ {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := exec.CommandContext(fctx, "fsfreeze", "-f", m.outer).Run()
		cancel()
		if err != nil {
			return fmt.Errorf("fsfreeze -f %s: %w", m.outer, err)
		}
		time.Sleep(on)
		if err := run("fsfreeze", "-u", m.outer); err != nil {
			return err
		}
		time.Sleep(off)
	}
	return nil
}

func (c *cluster) start(m *member) error {
	log, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	m.cmd = exec.Command(c.bin,
		"--name", m.name,
		"--data-dir", m.dataDir,
		"--listen-client-urls", m.clientURL,
		"--advertise-client-urls", m.clientURL,
		"--listen-peer-urls", m.peerURL,
		"--initial-advertise-peer-urls", m.proxyURL,
		"--initial-cluster", c.initial,
		"--initial-cluster-state", "new",
		"--initial-cluster-token", "monitoring",
		"--quota-backend-bytes", fmt.Sprint(quotaBytes),
		"--metrics", "extensive",
		"--heartbeat-interval", "100",
		"--election-timeout", "1000",
	)
	m.cmd.Stdout, m.cmd.Stderr = log, log
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		log.Close()
		return err
	}
	done := make(chan struct{})
	m.done = done
	go func(cmd *exec.Cmd) { cmd.Wait(); log.Close(); close(done) }(m.cmd)
	return nil
}

func (m *member) running() bool {
	if m.done == nil {
		return false
	}
	select {
	case <-m.done:
		return false
	default:
		return true
	}
}

func (m *member) kill() {
	if m.running() {
		m.cmd.Process.Signal(syscall.SIGKILL)
		<-m.done
	}
}

// status asks one member for its ID and the leader it knows (0 for none).
func (m *member) status(ctx context.Context) (id, leader uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := m.cli.Status(ctx, m.clientURL)
	if err != nil {
		return 0, 0, err
	}
	return st.Header.MemberId, st.Leader, nil
}

// waitHealthy waits until every running member names the same leader and takes a write.
func (c *cluster) waitHealthy(ctx context.Context, timeout time.Duration) (leader *member, err error) {
	deadline := time.Now().Add(timeout)
	for {
		leader, err = c.leader(ctx)
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = leader.cli.Put(pctx, "/monitoring/health", "ok")
			cancel()
			if err == nil {
				return leader, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("cluster not healthy after %s: %w", timeout, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// leader returns the member all running members name as leader.
func (c *cluster) leader(ctx context.Context) (*member, error) {
	ids := map[uint64]*member{}
	leaders := map[uint64]bool{}
	for _, m := range c.members {
		if !m.running() {
			continue
		}
		id, l, err := m.status(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.name, err)
		}
		ids[id] = m
		leaders[l] = true
	}
	if len(leaders) != 1 {
		return nil, fmt.Errorf("members disagree on the leader: %v", leaders)
	}
	for l := range leaders {
		if m, ok := ids[l]; ok {
			return m, nil
		}
		return nil, errors.New("no leader among the running members")
	}
	return nil, errors.New("no member running")
}

func (c *cluster) followers(leader *member) []*member {
	var out []*member
	for _, m := range c.members {
		if m != leader {
			out = append(out, m)
		}
	}
	return out
}

func (c *cluster) endpoints() string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientURL)
	}
	return strings.Join(eps, ",")
}

func (c *cluster) setDelay(d time.Duration) {
	for _, m := range c.members {
		m.proxy.setDelay(d)
	}
}

// close stops everything the cluster started; safe to call more than once.
func (c *cluster) close() {
	for _, m := range c.members {
		if m.outer != "" {
			exec.Command("fsfreeze", "-u", m.outer).Run() // in case a stall is still on
		}
		m.kill()
		if m.cli != nil {
			m.cli.Close()
		}
		if m.proxy != nil {
			m.proxy.close()
		}
		for _, fs := range []*string{&m.mount, &m.outer} {
			if *fs != "" {
				if err := run("umount", *fs); err != nil {
					fmt.Fprintln(os.Stderr, "warning:", err)
				}
				*fs = ""
			}
		}
	}
}
