package k8stest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// The processes of the cluster (etcd, kube-apiserver): started, waited for, stopped, their logs kept.

// FreeAddress returns 127.0.0.1:PORT with a port that was free a moment
// ago.
func FreeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func etcdHealthy(url string) error {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url + "/health")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body.String(), `"health":"true"`) {
		return fmt.Errorf("/health: %s %s", resp.Status, body.String())
	}
	return nil
}

// waitFor polls check until it returns nil, the process exits, or timeout.
func waitFor(timeout time.Duration, p *process, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("exited (%v) before it was ready", p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %w", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// process is a child process logging into a file.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProcess(name, log, bin string, args ...string) (*process, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fmt.Fprintf(f, "=== %s %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(append([]string{bin}, args...), " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Killed with the test process, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := startFromLauncher(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, log: log, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func startFromLauncher(cmd *exec.Cmd) error {
	done := make(chan error)
	launcher() <- func() { done <- cmd.Start() }
	return <-done
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, and SIGKILL after 10 s.
func (p *process) stop() {
	if p.exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *process) logTail() string {
	if p == nil {
		return ""
	}
	data, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	return lastLines(string(data), 40)
}

func (p *process) portInUse() bool {
	data, _ := os.ReadFile(p.log)
	return bytes.Contains(data, []byte("address already in use"))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
