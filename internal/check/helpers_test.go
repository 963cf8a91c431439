package check_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rte-project/rte/internal/check"
	"github.com/rte-project/rte/protocol"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/crypto/ssh"
)

// newChecker returns a Checker over a fresh ssh directory of its own.
func newChecker(t *testing.T, cfg check.Config) *check.Checker {
	t.Helper()
	if cfg.SSHDir == "" {
		cfg.SSHDir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	ch, err := check.New(cfg)
	if err != nil {
		t.Fatalf("check.New: %v", err)
	}
	return ch
}

// runOne checks a single target and returns its outcome.
func runOne(t *testing.T, ch *check.Checker, target protocol.CheckTarget, timeoutMS int) protocol.CheckOutcome {
	t.Helper()
	res := ch.Run(context.Background(), &protocol.Check{ID: "c1", Targets: []protocol.CheckTarget{target}, TimeoutMS: timeoutMS})
	if res.ID != "c1" || len(res.Results) != 1 {
		t.Fatalf("want one outcome for check c1, got id %q with %d outcomes", res.ID, len(res.Results))
	}
	o := res.Results[0]
	if o.Name != target.Name || o.Host != target.Host {
		t.Errorf("outcome names %q/%q, want the target's %q/%q", o.Name, o.Host, target.Name, target.Host)
	}
	if err := (protocol.CheckResult{ID: "c1", Results: res.Results}).Validate(); err != nil {
		t.Errorf("outcome does not validate as check.result: %v", err)
	}
	return o
}

// wantOutcome fails unless o has status and a message containing every one of parts.
func wantOutcome(t *testing.T, o protocol.CheckOutcome, status string, parts ...string) {
	t.Helper()
	t.Logf("%s in %d ms: %s", o.Status, o.LatencyMS, o.Message)
	if o.Status != status {
		t.Errorf("status %q (message %q), want %q", o.Status, o.Message, status)
	}
	for _, p := range parts {
		if !strings.Contains(o.Message, p) {
			t.Errorf("message %q does not contain %q", o.Message, p)
		}
	}
	if len(o.Message) > check.MaxMessageBytes || strings.ContainsAny(o.Message, "\r\n") {
		t.Errorf("message is not one line of at most %d bytes: %q", check.MaxMessageBytes, o.Message)
	}
	if o.LatencyMS < 0 {
		t.Errorf("latency_ms %d, want >= 0", o.LatencyMS)
	}
}

// noKeyMaterial fails if msg holds any part of a key: its base64 wire form (as in
// authorized_keys and known_hosts) or PEM text.
func noKeyMaterial(t *testing.T, msg string, keys ...ssh.PublicKey) {
	t.Helper()
	for _, k := range keys {
		b64 := base64.StdEncoding.EncodeToString(k.Marshal())
		// Any 24-character run of the base64 form would be a leak, not just the whole.
		for i := 0; i+24 <= len(b64); i += 12 {
			if strings.Contains(msg, b64[i:i+24]) {
				t.Fatalf("message holds key material of %s: %q", k.Type(), msg)
			}
		}
	}
	if strings.Contains(msg, "PRIVATE KEY") || strings.Contains(msg, "BEGIN ") {
		t.Fatalf("message holds PEM text: %q", msg)
	}
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// silentListener accepts connections and never writes, until the test ends: a host whose
// firewall lets the SYN through to a hung daemon.
func silentListener(t *testing.T) int {
	return fakeListener(t, nil)
}

// fakeListener accepts connections and holds them open until the test ends, or, given a
// greeting, writes it to each and closes it, as a server of another protocol does when it
// cannot make sense of the client.
func fakeListener(t *testing.T, greeting []byte) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if greeting != nil {
				c.Write(greeting)
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// newKey returns a fresh key pair of kind "ed25519" or "ecdsa".
func newKey(t *testing.T, kind string) (crypto.Signer, ssh.PublicKey) {
	t.Helper()
	var priv crypto.Signer
	var err error
	switch kind {
	case "ed25519":
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	case "ecdsa":
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		t.Fatalf("unknown key kind %q", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return priv, pub
}

// writePrivateKey writes priv in OpenSSH format to path, mode 0600, encrypted when passphrase
// is not empty.
func writePrivateKey(t *testing.T, path string, priv crypto.Signer, passphrase string) {
	t.Helper()
	var block *pem.Block
	var err error
	if passphrase == "" {
		block, err = ssh.MarshalPrivateKey(priv, "rte check test")
	} else {
		block, err = ssh.MarshalPrivateKeyWithPassphrase(priv, "rte check test", []byte(passphrase))
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeKnownHosts writes lines to dir/known_hosts.
func writeKnownHosts(t *testing.T, dir string, lines ...string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "known_hosts"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// sshd is a real OpenSSH server on loopback, run by the test.
type sshd struct {
	port     int
	hostKeys map[string]ssh.PublicKey // by key type
	user     ssh.PublicKey            // the one key authorized for every user
	userKey  crypto.Signer
}

// addr is the server's address as known_hosts names it.
func (s *sshd) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// startSSHD runs /usr/sbin/sshd in the foreground on 127.0.0.1 with an ed25519 and an ECDSA
// host key, accepting public keys only, for root among others; it stops when the test ends.
// It skips the test when sshd cannot run here (not installed, or not root).
func startSSHD(t *testing.T) *sshd {
	t.Helper()
	const bin = "/usr/sbin/sshd"
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no real sshd to test against (%v): apt-get install -y openssh-server", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("sshd must run as root to let the test log in as root; run the tests as root")
	}
	// sshd refuses to start without its privilege separation directory.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Skipf("sshd cannot run here: %v", err)
	}
	dir := t.TempDir()
	s := &sshd{port: closedPort(t), hostKeys: make(map[string]ssh.PublicKey)}
	var hostKeyLines []string
	for _, kind := range []string{"ed25519", "ecdsa"} {
		priv, pub := newKey(t, kind)
		path := filepath.Join(dir, "host_"+kind)
		writePrivateKey(t, path, priv, "")
		s.hostKeys[pub.Type()] = pub
		hostKeyLines = append(hostKeyLines, "HostKey "+path)
	}
	s.userKey, s.user = newKey(t, "ed25519")
	authorized := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(authorized, ssh.MarshalAuthorizedKey(s.user), 0o600); err != nil {
		t.Fatal(err)
	}
	config := strings.Join(append(hostKeyLines,
		fmt.Sprintf("ListenAddress 127.0.0.1:%d", s.port),
		"PidFile "+filepath.Join(dir, "sshd.pid"),
		"AuthorizedKeysFile "+authorized,
		"StrictModes no",
		"UsePAM no",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"PubkeyAuthentication yes",
		"PermitRootLogin prohibit-password",
		"LogLevel VERBOSE",
	), "\n") + "\n"
	configPath := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}

	var stderr syncBuffer
	cmd := exec.Command(bin, "-D", "-e", "-f", configPath)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Skipf("sshd cannot run here: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("sshd log:\n%s", stderr.String())
		}
	})

	// Ready when it accepts a connection and greets with its version.
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			t.Fatalf("sshd exited before it listened (%v):\n%s", err, stderr.String())
		default:
		}
		if greets(s.port) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd did not listen on 127.0.0.1:%d within 10 s:\n%s", s.port, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func greets(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 4)
	_, err = c.Read(buf)
	return err == nil && string(buf) == "SSH-"
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
