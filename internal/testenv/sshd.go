package testenv

import (
	"bufio"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
)

// SSHDPath is where Debian's openssh-server puts sshd; sshd must be started by absolute path.
const SSHDPath = "/usr/sbin/sshd"

// sshdStartLimit bounds how long sshd may take to greet; it normally takes milliseconds.
const sshdStartLimit = 15 * time.Second

// SSHDConfig says how to start an SSHD. The zero value is a test's sshd: an ed25519 host key,
// any user holding the client key, verbose log kept in memory.
type SSHDConfig struct {
	// Dir holds the config, the host keys, authorized_keys, the pid file and the log.
	Dir string
	// HostKeyTypes are the host keys to make: "ed25519" (the default) and/or "ecdsa".
	HostKeyTypes []string
	// AllowUsers, when set, is sshd's AllowUsers line (the demo lets in only its own user).
	AllowUsers string
	// LogLevel is sshd's LogLevel; VERBOSE by default, so a failed login says why.
	LogLevel string
	// SysProcAttr is the child's process attributes (the demo puts sshd in its own process
	// group and has the kernel end it with the demo).
	SysProcAttr *syscall.SysProcAttr
	// Log, when set, also receives sshd's output as it prints it, until Stop returns (the
	// demo's sshd.log, left in its work directory with --keep). Log always has all of it.
	Log io.Writer
}

// SSHD is a real OpenSSH server on 127.0.0.1 that lets in every user holding ClientKey
// (narrowed by AllowUsers). Stop ends it.
type SSHD struct {
	Port      int
	HostKeys  map[string]ssh.PublicKey // by key type (ssh.KeyAlgoED25519, ...)
	ClientKey ed25519.PrivateKey       // the one authorized client key
	ClientPub ssh.PublicKey

	cmd     *exec.Cmd
	log     Buffer
	done    chan struct{}
	waitErr error
}

// SSHDAvailable says why sshd cannot run here, or nil: it must be installed, and run as root,
// since a non-root sshd cannot switch users and the tests log in as root.
func SSHDAvailable() error {
	if _, err := os.Stat(SSHDPath); err != nil {
		return fmt.Errorf("no sshd (%w): apt-get install -y openssh-server", err)
	}
	if os.Geteuid() != 0 {
		return errors.New("sshd must run as root to let a client log in; run as root")
	}
	return nil
}

// StartSSHD writes keys and a config under cfg.Dir, starts sshd in the foreground on a free
// loopback port and returns once it greets. On failure the error carries the end of its log.
func StartSSHD(ctx context.Context, cfg SSHDConfig) (*SSHD, error) {
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	// sshd refuses to start without its privilege separation directory, which a machine that
	// never ran sshd as a service may lack.
	if os.Geteuid() == 0 {
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			return nil, fmt.Errorf("sshd: create /run/sshd: %w", err)
		}
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	s := &SSHD{Port: port, HostKeys: map[string]ssh.PublicKey{}, done: make(chan struct{})}
	kinds := cfg.HostKeyTypes
	if len(kinds) == 0 {
		kinds = []string{"ed25519"}
	}
	level := cfg.LogLevel
	if level == "" {
		level = "VERBOSE"
	}
	lines := []string{
		"ListenAddress 127.0.0.1:" + strconv.Itoa(port),
		"PidFile " + filepath.Join(cfg.Dir, "sshd.pid"),
		"AuthorizedKeysFile " + filepath.Join(cfg.Dir, "authorized_keys"),
		"PubkeyAuthentication yes",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"PermitRootLogin prohibit-password",
		"UsePAM no",
		// The key files sit in a temporary directory under /tmp, which is world-writable;
		// StrictModes would refuse them for that. Only the one client key is authorized.
		"StrictModes no",
		// ansible copies modules over sftp when the host offers it.
		"Subsystem sftp internal-sftp",
		"LogLevel " + level,
	}
	if cfg.AllowUsers != "" {
		lines = append(lines, "AllowUsers "+cfg.AllowUsers)
	}
	for _, kind := range kinds {
		priv, pub, err := NewKey(kind)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(cfg.Dir, "ssh_host_"+kind+"_key")
		if err := WritePrivateKey(path, priv, ""); err != nil {
			return nil, err
		}
		s.HostKeys[pub.Type()] = pub
		lines = append(lines, "HostKey "+path)
	}
	priv, pub, err := NewKey("ed25519")
	if err != nil {
		return nil, err
	}
	s.ClientKey, s.ClientPub = priv.(ed25519.PrivateKey), pub
	if err := os.WriteFile(filepath.Join(cfg.Dir, "authorized_keys"), ssh.MarshalAuthorizedKey(pub), 0o600); err != nil {
		return nil, err
	}
	configPath := filepath.Join(cfg.Dir, "sshd_config")
	if err := os.WriteFile(configPath, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return nil, err
	}

	cmd := exec.Command(SSHDPath, "-D", "-e", "-f", configPath)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = cfg.SysProcAttr
	var out io.Writer = &s.log
	if cfg.Log != nil {
		out = io.MultiWriter(&s.log, cfg.Log)
	}
	// One writer for both, so exec copies them through one pipe, in the order sshd wrote.
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", SSHDPath, err)
	}
	s.cmd = cmd
	go func() {
		s.waitErr = cmd.Wait()
		close(s.done)
	}()
	if err := s.waitGreeting(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// waitGreeting waits until sshd accepts a connection and greets with its version.
func (s *SSHD) waitGreeting(ctx context.Context) error {
	deadline := time.Now().Add(sshdStartLimit)
	for !greets(s.Addr()) {
		select {
		case <-s.done:
			return fmt.Errorf("sshd exited before it listened (%v):\n%s", s.waitErr, s.Log())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(PollEvery):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sshd did not listen on %s within %s:\n%s", s.Addr(), sshdStartLimit, s.Log())
		}
	}
	return nil
}

func greets(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	return err == nil && string(buf) == "SSH-"
}

// StartSSHDForTest starts an SSHD under a test's temporary directory and stops it when the
// test ends, logging sshd's output if the test failed. It skips the test when sshd cannot run
// here (SSHDAvailable) and fails it when sshd does not start.
func StartSSHDForTest(t T, cfg SSHDConfig) *SSHD {
	t.Helper()
	if err := SSHDAvailable(); err != nil {
		t.Skipf("no real sshd to test against: %v", err)
	}
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	s, err := StartSSHD(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("sshd log:\n%s", s.Log())
		}
	})
	return s
}

// Addr is sshd's address, 127.0.0.1:port.
func (s *SSHD) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// Log is everything sshd printed so far.
func (s *SSHD) Log() string { return s.log.String() }

// Stop ends sshd (TERM, then KILL after 5 s) and waits for it. It is safe to call twice.
func (s *SSHD) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// KnownHostsLine is the line for the host key of type keyType (ed25519 when empty), as
// ssh-keyscan -p writes it: ssh names a host on a non-standard port [127.0.0.1]:port.
func (s *SSHD) KnownHostsLine(keyType string) string {
	if keyType == "" {
		keyType = ssh.KeyAlgoED25519
	}
	return fmt.Sprintf("[127.0.0.1]:%d %s", s.Port, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.HostKeys[keyType]))))
}

// GiveKey puts the client key into home/.ssh as id_ed25519, as an operator would for the user
// the RTE runs as, and known_hosts holding knownHosts (none: no known_hosts file at all).
func (s *SSHD) GiveKey(home string, knownHosts ...string) error {
	dir := filepath.Join(home, ".ssh")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := WritePrivateKey(filepath.Join(dir, "id_ed25519"), s.ClientKey, ""); err != nil {
		return err
	}
	path := filepath.Join(dir, "known_hosts")
	if len(knownHosts) == 0 {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return err
		}
		return nil
	}
	return os.WriteFile(path, []byte(strings.Join(knownHosts, "\n")+"\n"), 0o600)
}

// NewKey returns a fresh key pair of kind "ed25519" or "ecdsa" (P-256).
func NewKey(kind string) (crypto.Signer, ssh.PublicKey, error) {
	var priv crypto.Signer
	switch kind {
	case "ed25519":
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		priv = k
	case "ecdsa":
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		priv = k
	default:
		return nil, nil, fmt.Errorf("key kind %q: want ed25519 or ecdsa", kind)
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		return nil, nil, err
	}
	return priv, pub, nil
}

// WritePrivateKey writes key in OpenSSH format with mode 0600, encrypted when passphrase is
// not empty.
func WritePrivateKey(path string, key crypto.Signer, passphrase string) error {
	var block *pem.Block
	var err error
	if passphrase == "" {
		block, err = ssh.MarshalPrivateKey(key, "rte test")
	} else {
		block, err = ssh.MarshalPrivateKeyWithPassphrase(key, "rte test", []byte(passphrase))
	}
	if err != nil {
		return fmt.Errorf("encode key %s: %w", path, err)
	}
	return os.WriteFile(path, pem.EncodeToMemory(block), 0o600)
}

// Tail is the last n lines of s, for an error message.
func Tail(s string, n int) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
