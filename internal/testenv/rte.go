package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// rteLiveLimit bounds how long a started RTE may take to answer /live; a race-enabled binary
// on a loaded 2-core machine can take seconds.
const rteLiveLimit = 60 * time.Second

// Build builds each of the module's commands named in cmds ("rte", "rte-app") into dir, with
// -race when race is true, so a test binary's TestMain builds them once for all its tests.
// moduleRoot is the path from the test's directory to the module root ("..").
func Build(dir, moduleRoot string, race bool, cmds ...string) error {
	for _, name := range cmds {
		args := []string{"build", "-o", filepath.Join(dir, name)}
		if race {
			args = append(args, "-race")
		}
		args = append(args, moduleRoot+"/cmd/"+name)
		cmd := exec.Command("go", args...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build %s: %w", name, err)
		}
	}
	return nil
}

// RTE is one running rte binary with its JSON log lines captured. It runs in its own process
// group, so Kill ends ansible-playbook and everything else it started with it.
type RTE struct {
	t    T
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

// StartRTE runs the rte binary bin in dir (also its HOME) on 127.0.0.1:port with env on top
// of a minimal base (PATH, HOME, PORT, LISTEN_HOST, LOG_LEVEL=debug), and waits for /live. The
// test's end kills it and, if the test failed, logs its output.
func StartRTE(t T, bin, dir string, port int, env ...string) *RTE {
	t.Helper()
	p := &RTE{t: t, Port: port, Dir: dir, added: make(chan struct{}, 1), exit: make(chan struct{})}
	for _, kv := range env {
		if kv == "HTTPS=1" {
			p.TLS = true
		}
	}
	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir,
		fmt.Sprintf("PORT=%d", port), "LISTEN_HOST=127.0.0.1", "LOG_LEVEL=debug",
	}, env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("rte: %v", err)
	}
	cmd.Stderr = cmd.Stdout
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start rte: %v", err)
	}
	p.cmd = cmd
	go p.collect(out)
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("rte log (port %d):\n%s", port, p.Log())
		}
	})
	p.waitLive()
	return p
}

func (p *RTE) collect(r io.Reader) {
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

// Pid is the RTE's process id (also its process group's).
func (p *RTE) Pid() int { return p.cmd.Process.Pid }

// Log is everything the process printed so far.
func (p *RTE) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.raw.String()
}

// Mark is the number of JSON log lines so far, for WaitLogAfter and Lines.
func (p *RTE) Mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lines)
}

// Lines is a copy of the JSON log lines logged after mark.
func (p *RTE) Lines(mark int) []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]map[string]any(nil), p.lines[mark:]...)
}

// WaitLog waits for a JSON log line whose "msg" contains msg, and returns it.
func (p *RTE) WaitLog(msg string, timeout time.Duration) map[string]any {
	p.t.Helper()
	return p.WaitLogAfter(0, msg, timeout)
}

// WaitLogAfter is WaitLog over the lines logged after mark.
func (p *RTE) WaitLogAfter(mark int, msg string, timeout time.Duration) map[string]any {
	p.t.Helper()
	return p.WaitLogMatch(mark, msg, timeout, func(map[string]any) bool { return true })
}

// WaitLogMatch waits for a line after mark whose "msg" contains msg and that match accepts.
func (p *RTE) WaitLogMatch(mark int, msg string, timeout time.Duration, match func(map[string]any) bool) map[string]any {
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

// URL is the RTE's own address.
func (p *RTE) URL() string {
	scheme := "http"
	if p.TLS {
		scheme = "https"
	}
	return fmt.Sprintf("%s://127.0.0.1:%d", scheme, p.Port)
}

// Probe GETs a path on the RTE with header (name, value, ...) and returns the status and up
// to 1 MiB of body; status 0 and the error's text when the request failed. It accepts any
// certificate: the probes are not the pinned path, which the tests of pinning cover.
func (p *RTE) Probe(path string, header ...string) (int, string) {
	p.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, p.URL()+path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // probing only; see above
	}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

func (p *RTE) waitLive() {
	p.t.Helper()
	live := Poll(rteLiveLimit, func() bool {
		select {
		case <-p.exit:
			p.t.Fatalf("rte exited (%v) before it was live:\n%s", p.err, p.Log())
		default:
		}
		code, _ := p.Probe("/live")
		return code == http.StatusOK
	})
	if !live {
		p.t.Fatalf("rte on port %d was not live within %s:\n%s", p.Port, rteLiveLimit, p.Log())
	}
}

// Signal sends sig to the RTE process (not its group).
func (p *RTE) Signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

// Wait waits for the process to exit and returns its exit code.
func (p *RTE) Wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.exit:
	case <-time.After(timeout):
		p.t.Fatalf("rte did not exit within %s", timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

// Kill stops the RTE and its whole process group at once, and waits up to 10 s for it.
func (p *RTE) Kill() {
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	select {
	case <-p.exit:
	case <-time.After(10 * time.Second):
	}
}

// RunRTE runs the rte binary bin to completion in dir (a subcommand: check-config, version)
// and returns its combined output and exit code; it fails t when the binary cannot run.
func RunRTE(t T, bin, dir string, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
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
