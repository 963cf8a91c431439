package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binDir holds the binaries built once for the whole package.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rte-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := func() int {
		defer os.RemoveAll(dir)
		defer stopPostgres() // pgstore_test.go
		for _, pkg := range []string{"rte", "rte-app"} {
			args := []string{"build", "-o", filepath.Join(dir, pkg)}
			if raceEnabled {
				args = append(args, "-race")
			}
			args = append(args, "../cmd/"+pkg)
			cmd := exec.Command("go", args...)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				fmt.Fprintf(os.Stderr, "build %s: %v\n", pkg, err)
				return 1
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

// freePort asks the kernel for a port that is free now. Another process could take it before
// the RTE listens; on loopback in a test that is rare enough, and the start would fail loudly.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// rteProc is one running rte binary with its log lines captured.
type rteProc struct {
	t    testing.TB
	cmd  *exec.Cmd
	Port int
	Dir  string
	TLS  bool

	mu    sync.Mutex
	lines []map[string]any
	raw   bytes.Buffer
	added chan struct{}
	exit  chan struct{}
	err   error
}

// startRTE runs the rte binary in dir with env (on top of a minimal base) and waits for /live.
func startRTE(t testing.TB, dir string, port int, env ...string) *rteProc {
	t.Helper()
	p := &rteProc{t: t, Port: port, Dir: dir, added: make(chan struct{}, 1), exit: make(chan struct{})}
	for _, kv := range env {
		if kv == "HTTPS=1" {
			p.TLS = true
		}
	}
	cmd := exec.Command(filepath.Join(binDir, "rte"))
	cmd.Dir = dir
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir,
		fmt.Sprintf("PORT=%d", port), "LISTEN_HOST=127.0.0.1", "LOG_LEVEL=debug",
	}, env...)
	stderr, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.cmd = cmd
	go p.collect(stderr)
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("rte log (port %d):\n%s", port, p.Log())
		}
	})
	p.waitLive()
	return p
}

func (p *rteProc) collect(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var m map[string]any
		_ = json.Unmarshal(line, &m)
		p.mu.Lock()
		p.raw.Write(line)
		p.raw.WriteByte('\n')
		if m != nil {
			p.lines = append(p.lines, m)
		}
		p.mu.Unlock()
		select {
		case p.added <- struct{}{}:
		default:
		}
	}
	p.err = p.cmd.Wait()
	close(p.exit)
}

// Log is everything the process printed so far.
func (p *rteProc) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.raw.String()
}

// Mark is the number of log lines so far, for WaitLogAfter.
func (p *rteProc) Mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lines)
}

// WaitLog waits for a JSON log line whose "msg" contains msg, and returns it.
func (p *rteProc) WaitLog(msg string, timeout time.Duration) map[string]any {
	p.t.Helper()
	return p.WaitLogAfter(0, msg, timeout)
}

// WaitLogAfter is WaitLog over the lines logged after mark.
func (p *rteProc) WaitLogAfter(mark int, msg string, timeout time.Duration) map[string]any {
	p.t.Helper()
	return p.WaitLogMatch(mark, msg, timeout, func(map[string]any) bool { return true })
}

// WaitLogMatch waits for a line after mark whose "msg" contains msg and that match accepts.
func (p *rteProc) WaitLogMatch(mark int, msg string, timeout time.Duration, match func(map[string]any) bool) map[string]any {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		p.mu.Lock()
		for _, l := range p.lines[mark:] {
			if s, _ := l["msg"].(string); strings.Contains(s, msg) && match(l) {
				p.mu.Unlock()
				return l
			}
		}
		p.mu.Unlock()
		select {
		case <-p.added:
		case <-p.exit:
			p.t.Fatalf("rte exited (%v) before logging %q", p.err, msg)
		case <-deadline:
			p.t.Fatalf("rte did not log %q within %s", msg, timeout)
		}
	}
}

func (p *rteProc) scheme() string {
	if p.TLS {
		return "https"
	}
	return "http"
}

// URL is the RTE's own address.
func (p *rteProc) URL() string { return fmt.Sprintf("%s://127.0.0.1:%d", p.scheme(), p.Port) }

// probe GETs a path on the RTE (any certificate accepted: the probes are not the pinned path).
func (p *rteProc) probe(path string, header ...string) (int, string) {
	p.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, p.URL()+path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // probing only; pinning is tested elsewhere
	}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

func (p *rteProc) waitLive() {
	p.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.exit:
			p.t.Fatalf("rte exited (%v) before it was live:\n%s", p.err, p.Log())
		default:
		}
		if code, _ := p.probe("/live"); code == http.StatusOK {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.t.Fatalf("rte on port %d was not live within 60s:\n%s", p.Port, p.Log())
}

// Signal sends sig to the RTE process.
func (p *rteProc) Signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

// Wait waits for the process to exit and returns its exit code.
func (p *rteProc) Wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.exit:
	case <-time.After(timeout):
		p.t.Fatalf("rte did not exit within %s", timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

// Kill stops the RTE and its whole process group at once.
func (p *rteProc) Kill() {
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	select {
	case <-p.exit:
	case <-time.After(10 * time.Second):
	}
}

// runRTE runs the rte binary to completion (subcommands) and returns output and exit code.
func runRTE(t *testing.T, dir string, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "rte"), args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		t.Fatalf("run rte %v: %v", args, err)
	}
	return string(out), 0
}
