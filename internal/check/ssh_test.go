package check_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rte-project/rte/internal/check"
	"github.com/rte-project/rte/protocol"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// TestSSH checks against a real sshd: every status an SSH target can have apart from
// timeout, which needs a server that never speaks (TestSSHWithoutServer).
func TestSSH(t *testing.T) {
	s := startSSHD(t)
	ed := s.hostKeys[ssh.KeyAlgoED25519]
	ec := s.hostKeys[ssh.KeyAlgoECDSA256]
	_, stranger := newKey(t, "ed25519")
	allKeys := []ssh.PublicKey{ed, ec, s.user, stranger}
	target := protocol.CheckTarget{Name: "web01", Host: "127.0.0.1", Port: s.port, User: "root", Transport: protocol.TransportSSH}
	ed25519Line := knownhosts.Line([]string{s.addr()}, ed)
	ecdsaLine := knownhosts.Line([]string{s.addr()}, ec)
	otherHostLine := knownhosts.Line([]string{"192.0.2.7"}, stranger)

	// Encrypting costs a bcrypt KDF of a second or more under -race: do it once.
	encrypted := filepath.Join(t.TempDir(), "encrypted")
	writePrivateKey(t, encrypted, s.userKey, "secret-passphrase")
	encryptedPEM, err := os.ReadFile(encrypted)
	if err != nil {
		t.Fatal(err)
	}
	writeEncrypted := func(t *testing.T, path string) {
		if err := os.WriteFile(path, encryptedPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// sshDir makes an ssh directory holding the authorized key as id_ed25519 (when authorized)
	// and a known_hosts of the given lines (none: no file).
	sshDir := func(t *testing.T, authorized bool, knownHosts ...string) string {
		dir := t.TempDir()
		if authorized {
			writePrivateKey(t, filepath.Join(dir, "id_ed25519"), s.userKey, "")
		}
		if len(knownHosts) > 0 {
			writeKnownHosts(t, dir, knownHosts...)
		}
		return dir
	}

	cases := []struct {
		name       string
		dir        func(t *testing.T) string
		user       string
		wantStatus string
		wantParts  []string
	}{
		{
			name:       "connected",
			dir:        func(t *testing.T) string { return sshDir(t, true, otherHostLine, ed25519Line) },
			wantStatus: protocol.CheckConnected,
			wantParts:  []string{`"root"`},
		},
		{
			// x/crypto asks for ECDSA before ed25519 by default; the host would look changed.
			name:       "known by its ed25519 key only",
			dir:        func(t *testing.T) string { return sshDir(t, true, ed25519Line) },
			wantStatus: protocol.CheckConnected,
		},
		{
			name:       "known by its ECDSA key only",
			dir:        func(t *testing.T) string { return sshDir(t, true, ecdsaLine) },
			wantStatus: protocol.CheckConnected,
		},
		{
			name:       "user that does not exist",
			dir:        func(t *testing.T) string { return sshDir(t, true, ed25519Line) },
			user:       "nosuchuser",
			wantStatus: protocol.CheckAuthFailed,
			wantParts:  []string{`"nosuchuser"`, "ssh-ed25519", "authorized_keys", s.addr()},
		},
		{
			name: "key not authorized",
			dir: func(t *testing.T) string {
				dir := sshDir(t, false, ed25519Line)
				priv, _ := newKey(t, "ecdsa")
				writePrivateKey(t, filepath.Join(dir, "id_ecdsa"), priv, "")
				return dir
			},
			wantStatus: protocol.CheckAuthFailed,
			wantParts:  []string{`"root"`, "ecdsa-sha2-nistp256"},
		},
		{
			name: "only an encrypted key",
			dir: func(t *testing.T) string {
				dir := sshDir(t, false, ed25519Line)
				writeEncrypted(t, filepath.Join(dir, "id_ed25519"))
				return dir
			},
			wantStatus: protocol.CheckAuthFailed,
			wantParts:  []string{"no usable private key", "skipped id_ed25519: encrypted"},
		},
		{
			name: "an encrypted key beside a usable one",
			dir: func(t *testing.T) string {
				dir := sshDir(t, true, ed25519Line)
				writeEncrypted(t, filepath.Join(dir, "id_rsa"))
				return dir
			},
			wantStatus: protocol.CheckConnected,
		},
		{
			name:       "host not in known_hosts",
			dir:        func(t *testing.T) string { return sshDir(t, true, otherHostLine) },
			wantStatus: protocol.CheckHostKeyUnknown,
			wantParts:  []string{fmt.Sprintf("[127.0.0.1]:%d", s.port), "SHA256:", fmt.Sprintf("ssh-keyscan -p %d 127.0.0.1", s.port), "out of band"},
		},
		{
			name:       "no known_hosts file",
			dir:        func(t *testing.T) string { return sshDir(t, true) },
			wantStatus: protocol.CheckHostKeyUnknown,
			wantParts:  []string{"known_hosts", "SHA256:"},
		},
		{
			// The right key, but under port 22's name: a non-standard port is [host]:port.
			name:       "known only without the port",
			dir:        func(t *testing.T) string { return sshDir(t, true, knownhosts.Line([]string{"127.0.0.1"}, ed)) },
			wantStatus: protocol.CheckHostKeyUnknown,
		},
		{
			name: "another key for the host",
			dir: func(t *testing.T) string {
				return sshDir(t, true, otherHostLine, knownhosts.Line([]string{s.addr()}, stranger))
			},
			wantStatus: protocol.CheckHostKeyMismatch,
			wantParts: []string{
				"line 2", ssh.FingerprintSHA256(stranger), ssh.FingerprintSHA256(ed), "attack", "reinstalled",
			},
		},
		{
			name: "revoked host key",
			dir: func(t *testing.T) string {
				return sshDir(t, true, ed25519Line, "@revoked * "+string(ssh.MarshalAuthorizedKey(ed)))
			},
			wantStatus: protocol.CheckHostKeyMismatch,
			wantParts:  []string{"revoked", "line 2", ssh.FingerprintSHA256(ed)},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ch := newChecker(t, check.Config{SSHDir: tc.dir(t)})
			tg := target
			if tc.user != "" {
				tg.User = tc.user
			}
			o := runOne(t, ch, tg, 5000)
			wantOutcome(t, o, tc.wantStatus, tc.wantParts...)
			noKeyMaterial(t, o.Message, allKeys...)
		})
	}

	t.Run("same target twice in one check", func(t *testing.T) {
		ch := newChecker(t, check.Config{SSHDir: sshDir(t, true, ed25519Line)})
		second := target
		second.Name = "web01-again"
		res := ch.Run(context.Background(), &protocol.Check{ID: "twice", Targets: []protocol.CheckTarget{target, second}, TimeoutMS: 5000})
		if len(res.Results) != 2 {
			t.Fatalf("want 2 outcomes, got %d", len(res.Results))
		}
		for i, name := range []string{"web01", "web01-again"} {
			if res.Results[i].Name != name {
				t.Errorf("outcome %d is for %q, want %q", i, res.Results[i].Name, name)
			}
			wantOutcome(t, res.Results[i], protocol.CheckConnected)
		}
	})

	t.Run("a key added between checks is used without a restart", func(t *testing.T) {
		dir := sshDir(t, false, ed25519Line)
		ch := newChecker(t, check.Config{SSHDir: dir})
		wantOutcome(t, runOne(t, ch, target, 5000), protocol.CheckAuthFailed, "no usable private key")
		writePrivateKey(t, filepath.Join(dir, "id_ed25519"), s.userKey, "")
		wantOutcome(t, runOne(t, ch, target, 5000), protocol.CheckConnected)
	})

	t.Run("known_hosts given apart from the ssh directory", func(t *testing.T) {
		khDir := sshDir(t, false, ed25519Line)
		ch := newChecker(t, check.Config{SSHDir: sshDir(t, true), KnownHosts: filepath.Join(khDir, "known_hosts")})
		wantOutcome(t, runOne(t, ch, target, 5000), protocol.CheckConnected)
	})
}

// TestSSHWithoutServer covers the outcomes that need no sshd: nothing listening, a listener
// that never speaks, something that is not SSH, and a cancelled check.
func TestSSHWithoutServer(t *testing.T) {
	ch := newChecker(t, check.Config{})
	ssh := func(port int) protocol.CheckTarget {
		return protocol.CheckTarget{Name: "h", Host: "127.0.0.1", Port: port, User: "ansible", Transport: protocol.TransportSSH}
	}

	t.Run("closed port", func(t *testing.T) {
		port := closedPort(t)
		wantOutcome(t, runOne(t, ch, ssh(port), 2000), protocol.CheckUnreachable, "refused", fmt.Sprintf("127.0.0.1:%d", port))
	})
	t.Run("accepts but never speaks", func(t *testing.T) {
		wantOutcome(t, runOne(t, ch, ssh(silentListener(t)), 300), protocol.CheckTimeout, "handshake did not finish within 300 ms")
	})
	t.Run("speaks something else", func(t *testing.T) {
		port := fakeListener(t, []byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
		wantOutcome(t, runOne(t, ch, ssh(port), 2000), protocol.CheckUnreachable, "SSH handshake failed")
	})
	t.Run("unreadable known_hosts", func(t *testing.T) {
		dir := t.TempDir()
		writeKnownHosts(t, dir, "this is not a known_hosts line")
		bad := newChecker(t, check.Config{SSHDir: dir})
		wantOutcome(t, runOne(t, bad, ssh(closedPort(t)), 2000), protocol.CheckHostKeyUnknown, "cannot read known_hosts", filepath.Join(dir, "known_hosts"))
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		port := silentListener(t)
		done := make(chan protocol.CheckResult)
		go func() {
			done <- ch.Run(ctx, &protocol.Check{ID: "c", Targets: []protocol.CheckTarget{ssh(port)}, TimeoutMS: 60000})
		}()
		time.Sleep(50 * time.Millisecond) // let the dial start; the outcome is the same either way
		cancel()
		select {
		case res := <-done:
			wantOutcome(t, res.Results[0], protocol.CheckTimeout, "cancelled")
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return within 10 s of its context's cancel (its timeout was 60 s)")
		}
	})
}
