package check_test

import (
	"context"
	"crypto"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rte-project/rte/internal/check"
	"github.com/rte-project/rte/internal/testenv"
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
	priv, pub, err := testenv.NewKey(kind)
	if err != nil {
		t.Fatal(err)
	}
	return priv, pub
}

// writePrivateKey writes priv in OpenSSH format to path, mode 0600, encrypted when passphrase
// is not empty.
func writePrivateKey(t *testing.T, path string, priv crypto.Signer, passphrase string) {
	t.Helper()
	if err := testenv.WritePrivateKey(path, priv, passphrase); err != nil {
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

// startSSHD runs the shared real sshd (testenv.SSHD) on 127.0.0.1 with an ed25519 and an
// ECDSA host key, accepting public keys only, for root among others; it stops when the test
// ends. It skips the test when sshd cannot run here (not installed, or not root).
func startSSHD(t *testing.T) *sshd {
	t.Helper()
	s := testenv.StartSSHDForTest(t, testenv.SSHDConfig{HostKeyTypes: []string{"ed25519", "ecdsa"}})
	return &sshd{port: s.Port, hostKeys: s.HostKeys, user: s.ClientPub, userKey: s.ClientKey}
}
