package controlplane

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is one child process whose stdout and stderr go to a log file. Set its
// exported fields, then Start it; it can be killed and started again with the
// same arguments.
type Proc struct {
	Name    string   // label used in log lines and errors
	Bin     string   // path of the executable
	Args    []string // arguments, without the program name
	LogPath string   // stdout and stderr are appended here
	// Argv0, if set, is the program name the process is given (argv[0])
	// instead of Bin, as a container runtime passes a container's command[0].
	Argv0 string
	// Env, if not nil, is the process's whole environment; nil means this
	// process's environment.
	Env []string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// Start starts the process. It writes a header line with the command line to
// the log first, so restarts are easy to tell apart.
func (p *Proc) Start() error {
	logFile, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logFile, "=== %s start %s: %s %s\n", p.Name, time.Now().Format(time.RFC3339Nano), p.Bin, strings.Join(p.Args, " "))
	cmd := exec.Command(p.Bin, p.Args...)
	if p.Argv0 != "" {
		cmd.Args[0] = p.Argv0
	}
	cmd.Env = p.Env
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Kill the child if the parent dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited, p.waitErr = cmd, exited, nil
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logFile.Close()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

func (p *Proc) exitedCh() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// Alive reports whether the process was started and has not exited.
func (p *Proc) Alive() bool {
	ch := p.exitedCh()
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// ExitErr is the error from the last run's Wait (nil while running or after a
// clean exit).
func (p *Proc) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Pid is the process id of the last start, or 0 if it was never started.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill() {
	if !p.Alive() {
		return
	}
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	_ = cmd.Process.Kill()
	<-p.exitedCh()
}

// Stop sends SIGTERM, then SIGKILL if the process is still there after 10 s,
// and waits for it to be gone.
func (p *Proc) Stop() {
	if !p.Alive() {
		return
	}
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exitedCh():
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-p.exitedCh()
	}
}

// TailFile returns the last n lines of the file at path (each cut to 400
// characters), or the read error's text.
func TailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		if len(l) > 400 {
			lines[i] = l[:400] + "…"
		}
	}
	return strings.Join(lines, "\n")
}

// Poll calls cond every interval until it returns true or an error, or timeout
// passes; on timeout the error carries cond's last "why not" message.
func Poll(timeout, interval time.Duration, cond func() (ok bool, why string, err error)) error {
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, why, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		last = why
		if time.Now().After(deadline) {
			return fmt.Errorf("condition not met after %v (last: %s)", timeout, last)
		}
		time.Sleep(interval)
	}
}
