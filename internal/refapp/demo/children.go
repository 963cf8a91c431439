package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/rte-project/rte/internal/testenv"
)

// The demo's children are the tests' own: testenv's sshd launcher and RTE process, started
// with the demo's settings. This file holds only what the demo adds to them: its log files,
// its operator's wording, and the ssh files the inventory names.

// sshHost is the demo's second managed host: testenv's sshd on loopback with its own host key,
// which the RTE's ssh knows in advance (no host key checking is turned off), and a client key
// that only this sshd accepts.
type sshHost struct {
	*testenv.SSHD
	User         string
	KnownHosts   string // known_hosts holding exactly this sshd's host key
	IdentityFile string // the client's private key
	HostKeyFP    string // SHA256:... as ssh prints it
	log          *os.File
}

// sshDefault reports whether the demo adds the ssh host by default: only as root, since a
// non-root sshd cannot switch users and warns about privilege separation.
func sshDefault() bool { return testenv.SSHDAvailable() == nil }

// startSSHD starts sshd with its files and its log (sshd.log) under dir, letting in only the
// current user. The client's files (identity, known_hosts) go under home/.ssh.
func startSSHD(ctx context.Context, dir, home string) (*sshHost, error) {
	u, err := user.Current()
	if err != nil {
		return nil, fmt.Errorf("sshd: who am I: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "sshd.log"))
	if err != nil {
		return nil, err
	}
	s, err := testenv.StartSSHD(ctx, testenv.SSHDConfig{
		Dir:         dir,
		AllowUsers:  u.Username,
		LogLevel:    "INFO",
		SysProcAttr: testenv.OwnGroupTiedToParent(),
		Log:         logFile,
	})
	if err != nil {
		logFile.Close()
		return nil, err
	}
	h := &sshHost{
		SSHD:         s,
		User:         u.Username,
		KnownHosts:   filepath.Join(home, ".ssh", "known_hosts"),
		IdentityFile: filepath.Join(home, ".ssh", "id_ed25519"),
		HostKeyFP:    ssh.FingerprintSHA256(s.HostKeys[ssh.KeyAlgoED25519]),
		log:          logFile,
	}
	if err := s.GiveKey(home, s.KnownHostsLine(ssh.KeyAlgoED25519)); err != nil {
		h.Stop()
		return nil, err
	}
	return h, nil
}

// Stop ends sshd, waits for it, and closes its log.
func (h *sshHost) Stop() {
	h.SSHD.Stop()
	h.log.Close()
}

// demoRTE is the RTE child, its output also in dir/rte.log.
type demoRTE struct {
	*testenv.RTE
	log *os.File
}

// startRTE starts bin in dir with exactly env, in its own process group tied to rte-app. Its
// log lines (stdout and stderr together) go to dir/rte.log, and also to echo when it is not nil.
func startRTE(bin, dir string, env []string, echo io.Writer) (*demoRTE, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "rte.log"))
	if err != nil {
		return nil, err
	}
	var sink io.Writer = logFile
	if echo != nil {
		sink = io.MultiWriter(logFile, echo)
	}
	p, err := testenv.LaunchRTE(testenv.RTEConfig{
		Bin: bin, Dir: dir, Env: env, Log: sink, SysProcAttr: testenv.OwnGroupTiedToParent(),
	})
	if err != nil {
		logFile.Close()
		return nil, err
	}
	return &demoRTE{RTE: p, log: logFile}, nil
}

// Stop sends SIGTERM (the RTE drains), waits up to timeout, then kills it; then it closes the
// log, which nothing writes once the process's output is collected.
func (p *demoRTE) Stop(timeout time.Duration) error {
	defer p.log.Close()
	return p.RTE.Stop(timeout)
}

// WaitStarting returns the fields of the RTE's "rte starting" log line.
func (p *demoRTE) WaitStarting(ctx context.Context, timeout time.Duration) (map[string]string, error) {
	l, err := p.WaitLine(ctx, 0, timeout, func(m map[string]any) bool { return m["msg"] == "rte starting" })
	switch {
	case errors.Is(err, testenv.ErrExited):
		return nil, fmt.Errorf("the RTE exited at start (%v); its log:\n%s", p.Err(), p.LogTail(25))
	case err != nil && ctx.Err() != nil:
		return nil, errors.New("interrupted while the RTE started")
	case err != nil:
		return nil, fmt.Errorf("the RTE logged no \"rte starting\" line within %s; its log:\n%s", timeout, p.LogTail(25))
	}
	fields := map[string]string{}
	for k, v := range l {
		if s, ok := v.(string); ok {
			fields[k] = s
		}
	}
	return fields, nil
}

// LogTail is the last n lines of the RTE's log, indented under an error message.
func (p *demoRTE) LogTail(n int) string {
	lines := testenv.Tail(p.Log(), n)
	if lines == "" {
		return "(the log is empty)"
	}
	return "  " + strings.ReplaceAll(lines, "\n", "\n  ")
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
