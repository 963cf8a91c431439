package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
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

// RTE is one running rte binary with its log lines captured (all of them as printed, the JSON
// ones also decoded). StartRTE starts one for a test; LaunchRTE starts one for the demo, which
// is not a test and handles errors itself.
type RTE struct {
	t    T // nil when LaunchRTE started it: the methods that fail a test need StartRTE's
	cmd  *exec.Cmd
	Port int
	Dir  string
	TLS  bool

	sink  io.Writer // RTEConfig.Log; written only by collect
	mu    sync.Mutex
	lines []map[string]any
	raw   bytes.Buffer
	added chan struct{}
	exit  chan struct{}
	err   error
}

// RTEConfig says how LaunchRTE runs an rte binary.
type RTEConfig struct {
	Bin  string   // the rte binary (or rte-app, for a harness that runs the app as a process)
	Args []string // the arguments after the binary's name (rte-app needs "serve")
	Dir  string   // its working directory, created if missing
	Env  []string // exactly the child's environment
	// Log, when set, also receives every line the child prints (stdout and stderr together),
	// one Write per line, until Done is closed: the demo's rte.log and its --verbose echo.
	Log io.Writer
	// SysProcAttr is the child's process attributes; nil means its own process group, so
	// Kill ends ansible-playbook and everything else the RTE started with it.
	SysProcAttr *syscall.SysProcAttr
}

// LaunchRTE starts cfg.Bin and collects its output; it does not wait for anything. The caller
// owns the process: Stop or Kill it, and wait for Done before closing cfg.Log.
func LaunchRTE(cfg RTEConfig) (*RTE, error) {
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	p := &RTE{Dir: cfg.Dir, sink: cfg.Log, added: make(chan struct{}, 1), exit: make(chan struct{})}
	cmd := exec.Command(cfg.Bin, cfg.Args...)
	cmd.Dir = cfg.Dir
	cmd.Env = cfg.Env
	cmd.SysProcAttr = cfg.SysProcAttr
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("rte: %w", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the RTE %s: %w", cfg.Bin, err)
	}
	p.cmd = cmd
	go p.collect(out)
	return p, nil
}

// StartRTE runs the rte binary bin in dir (also its HOME) on 127.0.0.1:port with env on top
// of a minimal base (PATH, HOME, PORT, LISTEN_HOST, LOG_LEVEL=debug), and waits for /live. The
// test's end kills it and, if the test failed, logs its output.
func StartRTE(t T, bin, dir string, port int, env ...string) *RTE {
	t.Helper()
	return StartRTEAs(t, nil, bin, dir, port, env...)
}

// StartRTEAs is StartRTE with the child running as cred's user and groups (nil: as the test
// itself), in its own process group. bin and dir must be reachable by that user: dir is not
// created with its ownership, so the caller makes and chowns it.
func StartRTEAs(t T, cred *syscall.Credential, bin, dir string, port int, env ...string) *RTE {
	t.Helper()
	var attr *syscall.SysProcAttr
	if cred != nil {
		attr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	}
	p, err := LaunchRTE(RTEConfig{Bin: bin, Dir: dir, SysProcAttr: attr, Env: append([]string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir,
		fmt.Sprintf("PORT=%d", port), "LISTEN_HOST=127.0.0.1", "LOG_LEVEL=debug",
	}, env...)})
	if err != nil {
		t.Fatalf("%v", err)
	}
	p.t, p.Port = t, port
	for _, kv := range env {
		if kv == "HTTPS=1" {
			p.TLS = true
		}
	}
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
		if p.sink != nil {
			_, _ = p.sink.Write(append(line, '\n'))
		}
		select {
		case p.added <- struct{}{}:
		default:
		}
	}
	// Drain what a too-long line left, so the child never blocks writing to a full pipe.
	rest := p.sink
	if rest == nil {
		rest = io.Discard
	}
	_, _ = io.Copy(rest, r)
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
	l, err := p.WaitLine(context.Background(), mark, timeout, func(l map[string]any) bool {
		s, _ := l["msg"].(string)
		return strings.Contains(s, msg) && match(l)
	})
	switch {
	case err == nil:
		return l
	case errors.Is(err, ErrExited):
		p.t.Fatalf("rte exited (%v) before logging %q", p.err, msg)
	default:
		p.t.Fatalf("rte did not log %q within %s", msg, timeout)
	}
	return nil
}

// ErrExited is WaitLine's error when the process exited first; Err then says how.
var ErrExited = errors.New("the RTE exited")

// WaitLine waits for a JSON log line after mark that match accepts, and returns it. It fails
// with ErrExited when the process exits first, ctx's error when ctx ends, and
// context.DeadlineExceeded when timeout passes.
func (p *RTE) WaitLine(ctx context.Context, mark int, timeout time.Duration, match func(map[string]any) bool) (map[string]any, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		for _, l := range p.lines[mark:] {
			if match(l) {
				p.mu.Unlock()
				return l, nil
			}
		}
		// Lines looked at need not be looked at again.
		mark = len(p.lines)
		p.mu.Unlock()
		select {
		case <-p.added:
		case <-p.exit:
			// collect appends every line before it closes exit: one last look.
			p.mu.Lock()
			for _, l := range p.lines[mark:] {
				if match(l) {
					p.mu.Unlock()
					return l, nil
				}
			}
			p.mu.Unlock()
			return nil, ErrExited
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline.C:
			return nil, context.DeadlineExceeded
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
	select {
	case <-p.exit:
		// Reaped: its pid and group id may already be someone else's.
		return
	default:
	}
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		// The group kill misses an RTE that is not its group's leader (LaunchRTE's caller
		// chose other attributes).
		_ = p.cmd.Process.Kill()
	}
	select {
	case <-p.exit:
	case <-time.After(10 * time.Second):
	}
}

// Stop sends SIGTERM to the RTE (it drains, then exits), waits up to timeout, then kills it as
// Kill does. It returns an error only when the RTE had to be killed.
func (p *RTE) Stop(timeout time.Duration) error {
	select {
	case <-p.exit:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.exit:
		return nil
	case <-t.C:
		p.Kill()
		return fmt.Errorf("the RTE did not stop within %s of SIGTERM and was killed", timeout)
	}
}

// Done is closed once the process has exited and its output is collected; Err then says how
// it exited.
func (p *RTE) Done() <-chan struct{} { return p.exit }

// Err is how the process exited; valid once Done is closed.
func (p *RTE) Err() error { return p.err }

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
