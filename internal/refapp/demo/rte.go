package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RTE is the RTE binary running as a child, its log captured to a file.
type RTE struct {
	cmd      *exec.Cmd
	logPath  string
	starting chan map[string]string // the "rte starting" line's fields, sent once
	done     chan struct{}          // closed when the process has exited
	waitErr  error                  // set before done is closed
	wg       sync.WaitGroup
}

// StartRTE starts bin in dir with exactly env, and collects its log lines (stdout and stderr
// together) into dir/rte.log, echoing them to echo when it is not nil.
func StartRTE(bin, dir string, env []string, echo io.Writer) (*RTE, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &RTE{
		logPath:  filepath.Join(dir, "rte.log"),
		starting: make(chan map[string]string, 1),
		done:     make(chan struct{}),
	}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = env
	cmd.SysProcAttr = childAttr()
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start the RTE %s: %w", bin, err)
	}
	p.cmd = cmd
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer logFile.Close()
		p.collect(pipe, logFile, echo)
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *RTE) collect(r io.Reader, log io.Writer, echo io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		line := sc.Bytes()
		_, _ = log.Write(append(line, '\n'))
		if echo != nil {
			_, _ = echo.Write(append(line, '\n'))
		}
		if sent {
			continue
		}
		var m map[string]any
		if json.Unmarshal(line, &m) == nil && m["msg"] == "rte starting" {
			fields := map[string]string{}
			for k, v := range m {
				if s, ok := v.(string); ok {
					fields[k] = s
				}
			}
			p.starting <- fields
			sent = true
		}
	}
	// Drain what a too-long line left, so the child never blocks writing to a full pipe.
	_, _ = io.Copy(log, r)
}

// WaitStarting returns the fields of the RTE's "rte starting" log line.
func (p *RTE) WaitStarting(ctx context.Context, timeout time.Duration) (map[string]string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case f := <-p.starting:
		return f, nil
	case <-p.done:
		return nil, fmt.Errorf("the RTE exited at start (%v); its log:\n%s", p.waitErr, tail(p.logPath, 25))
	case <-ctx.Done():
		return nil, errors.New("interrupted while the RTE started")
	case <-t.C:
		return nil, fmt.Errorf("the RTE logged no \"rte starting\" line within %s; its log:\n%s", timeout, tail(p.logPath, 25))
	}
}

// Stop sends SIGTERM (the RTE drains), waits up to timeout, then kills it, and waits for the
// log collector.
func (p *RTE) Stop(timeout time.Duration) error {
	defer p.wg.Wait()
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("the RTE did not stop within %s of SIGTERM and was killed", timeout)
	}
}

// prefixWriter writes each Write, a whole log line, behind a prefix.
type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	text := strings.TrimRight(string(b), "\n")
	for _, line := range strings.Split(text, "\n") {
		if _, err := io.WriteString(p.w, p.prefix+line+"\n"); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

// Done is closed when the process has exited; Err then says how.
func (p *RTE) Done() <-chan struct{} { return p.done }

// Err is how the process exited; valid once Done is closed.
func (p *RTE) Err() error { return p.waitErr }

// LogTail is the last n lines of the RTE's log.
func (p *RTE) LogTail(n int) string { return tail(p.logPath, n) }
