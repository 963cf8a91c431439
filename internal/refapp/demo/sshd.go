package demo

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
)

// sshdPath is where Debian's openssh-server puts sshd; it must be started by absolute path.
const sshdPath = "/usr/sbin/sshd"

// sshHost is the demo's second managed host: a private sshd on loopback with its own host key,
// which the RTE's ssh knows in advance (no host key checking is turned off), and a client key
// that only this sshd accepts.
type sshHost struct {
	Port           int
	User           string
	KnownHosts     string // known_hosts holding exactly this sshd's host key
	IdentityFile   string // the client's private key
	HostKeyFP      string // SHA256:... as ssh prints it
	cmd            *exec.Cmd
	logPath        string
	done           chan struct{}
	waitErr        error
	collectorsDone sync.WaitGroup
}

// sshDefault reports whether the demo adds the ssh host by default: only as root, since a
// non-root sshd cannot switch users and warns about privilege separation.
func sshDefault() bool {
	if _, err := os.Stat(sshdPath); err != nil {
		return false
	}
	return os.Geteuid() == 0
}

// startSSHD writes keys and a config under dir and starts sshd on 127.0.0.1:port. The
// client's files (identity, known_hosts) go under home/.ssh.
func startSSHD(ctx context.Context, dir, home string) (*sshHost, error) {
	u, err := user.Current()
	if err != nil {
		return nil, fmt.Errorf("sshd: who am I: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	sshDir := filepath.Join(home, ".ssh")
	if err := os.MkdirAll(sshDir, 0o700); err != nil {
		return nil, err
	}
	hostPub, err := writeKey(filepath.Join(dir, "ssh_host_ed25519_key"), "rte-demo sshd")
	if err != nil {
		return nil, err
	}
	clientPub, err := writeKey(filepath.Join(sshDir, "id_ed25519"), "rte-demo client")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), ssh.MarshalAuthorizedKey(clientPub), 0o600); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	h := &sshHost{
		Port:         port,
		User:         u.Username,
		KnownHosts:   filepath.Join(sshDir, "known_hosts"),
		IdentityFile: filepath.Join(sshDir, "id_ed25519"),
		HostKeyFP:    ssh.FingerprintSHA256(hostPub),
		logPath:      filepath.Join(dir, "sshd.log"),
		done:         make(chan struct{}),
	}
	// known_hosts names the host as ssh looks it up for a non-standard port: [127.0.0.1]:port.
	line := fmt.Sprintf("[127.0.0.1]:%d %s", port, ssh.MarshalAuthorizedKey(hostPub))
	if err := os.WriteFile(h.KnownHosts, []byte(line), 0o600); err != nil {
		return nil, err
	}
	config := strings.Join([]string{
		"Port " + strconv.Itoa(port),
		"ListenAddress 127.0.0.1",
		"HostKey " + filepath.Join(dir, "ssh_host_ed25519_key"),
		"PidFile " + filepath.Join(dir, "sshd.pid"),
		"AuthorizedKeysFile " + filepath.Join(dir, "authorized_keys"),
		"AllowUsers " + u.Username,
		"PubkeyAuthentication yes",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"PermitRootLogin prohibit-password",
		"UsePAM no",
		// The key files sit in a temporary directory under /tmp, which is world-writable;
		// StrictModes would refuse them for that. Only this demo's key is authorized.
		"StrictModes no",
		"Subsystem sftp internal-sftp",
		"LogLevel INFO",
		"",
	}, "\n")
	configPath := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		return nil, err
	}
	// sshd refuses to start without its privilege separation directory, which a machine
	// that never ran sshd as a service may lack.
	if os.Geteuid() == 0 {
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			return nil, fmt.Errorf("sshd: create /run/sshd: %w", err)
		}
	}
	logFile, err := os.Create(h.logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(sshdPath, "-D", "-e", "-f", configPath)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = childAttr()
	out, err := cmd.StderrPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	cmd.Stdout = logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", sshdPath, err)
	}
	h.cmd = cmd
	h.collectorsDone.Add(1)
	go func() {
		defer h.collectorsDone.Done()
		defer logFile.Close()
		_, _ = io.Copy(logFile, out)
		h.waitErr = cmd.Wait()
		close(h.done)
	}()
	if err := h.waitListening(ctx); err != nil {
		h.Stop()
		return nil, err
	}
	return h, nil
}

// waitListening waits until sshd accepts connections, or fails with its log if it exits.
func (h *sshHost) waitListening(ctx context.Context) error {
	deadline := time.Now().Add(15 * time.Second)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(h.Port))
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-h.done:
			return fmt.Errorf("sshd exited at start (%v):\n%s", h.waitErr, tail(h.logPath, 20))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sshd does not listen on %s after 15s:\n%s", addr, tail(h.logPath, 20))
		}
	}
}

// Stop ends sshd and waits for it.
func (h *sshHost) Stop() {
	if h.cmd == nil || h.cmd.Process == nil {
		return
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
	case <-time.After(5 * time.Second):
		_ = h.cmd.Process.Kill()
	}
	h.collectorsDone.Wait()
}

// writeKey writes a new ed25519 private key in OpenSSH format (mode 0600) and returns its
// public half.
func writeKey(path, comment string) (ssh.PublicKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return nil, fmt.Errorf("encode key %s: %w", path, err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, err
	}
	return ssh.NewPublicKey(pub)
}

// freePort asks the kernel for a loopback port that is free now. Something else could take it
// before the child listens; the child then fails to start, loudly.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tail returns the last n lines of a file, for an error message.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if len(lines) == 0 {
		return "(the log is empty)"
	}
	return "  " + strings.Join(lines, "\n  ")
}
