package check

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/rte-project/rte/protocol"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// TestMessages builds every kind of message from ordinary and hostile inputs (a host name of
// a kilobyte, control characters, non-ASCII) and checks that each is one bounded line of valid
// UTF-8 that names no key material, and that an ordinary one is whole and says what it must.
func TestMessages(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	presented, _ := ssh.NewPublicKey(pub)
	knownPub, _, _ := ed25519.GenerateKey(rand.Reader)
	known, _ := ssh.NewPublicKey(knownPub)
	signer, _ := ssh.NewSignerFromKey(priv)
	cert := &ssh.Certificate{Key: presented, CertType: ssh.HostCert}
	keys := []ssh.PublicKey{presented, known, signer.PublicKey()}

	hosts := map[string]string{
		"ordinary":  "web01.example.com",
		"long":      strings.Repeat("a", 1000) + ".example.com",
		"control":   "web01\n\x1b[31mred\r\x00",
		"non-ASCII": strings.Repeat("höst-例え.", 60),
	}
	b := &batch{timeout: 5 * time.Second}
	const khPath = "/home/rte/.ssh/known_hosts"

	type msgCase struct {
		name   string
		make   func(e endpoint) result
		status string
		parts  []string // in the ordinary message
	}
	cases := []msgCase{
		{"host key unknown", func(e endpoint) result {
			return hostKeyFailure(e, khPath, e.addr, presented, &knownhosts.KeyError{})
		}, protocol.CheckHostKeyUnknown, []string{ssh.FingerprintSHA256(presented), khPath, "ssh-keyscan -p 2222 web01.example.com"}},
		{"host certificate unknown", func(e endpoint) result {
			return hostKeyFailure(e, khPath, e.addr, cert, &knownhosts.KeyError{})
		}, protocol.CheckHostKeyUnknown, []string{ssh.FingerprintSHA256(presented), "@cert-authority"}},
		{"host key mismatch", func(e endpoint) result {
			return hostKeyFailure(e, khPath, e.addr, presented, &knownhosts.KeyError{Want: []knownhosts.KnownKey{{Key: known, Filename: khPath, Line: 17}}})
		}, protocol.CheckHostKeyMismatch, []string{ssh.FingerprintSHA256(presented), ssh.FingerprintSHA256(known), "line 17", "attack"}},
		{"host key revoked", func(e endpoint) result {
			return hostKeyFailure(e, khPath, e.addr, presented, &knownhosts.RevokedError{Revoked: knownhosts.KnownKey{Key: presented, Filename: khPath, Line: 3}})
		}, protocol.CheckHostKeyMismatch, []string{"revoked", "line 3"}},
		{"host key other error", func(e endpoint) result {
			return hostKeyFailure(e, khPath, e.addr, cert, errors.New("ssh: cert has expired"))
		}, protocol.CheckHostKeyUnknown, []string{"expired"}},
		{"auth failed", func(e endpoint) result {
			return authFailed(e, "ansible", "/home/rte/.ssh", &sshFiles{signers: []ssh.Signer{signer}, keyTypes: []string{"ssh-ed25519"}})
		}, protocol.CheckAuthFailed, []string{`"ansible"`, "ssh-ed25519", "authorized_keys"}},
		{"no usable key", func(e endpoint) result {
			return authFailed(e, "ansible", "/home/rte/.ssh", &sshFiles{skipped: []string{"id_rsa: encrypted"}})
		}, protocol.CheckAuthFailed, []string{"/home/rte/.ssh", "id_rsa: encrypted"}},
		{"refused", func(e endpoint) result {
			return dialFailure(context.Background(), b, e, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})
		}, protocol.CheckUnreachable, []string{"web01.example.com:2222 refused"}},
		{"no route", func(e endpoint) result {
			return dialFailure(context.Background(), b, e, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)})
		}, protocol.CheckUnreachable, []string{"no route"}},
		{"no such host", func(e endpoint) result {
			return dialFailure(context.Background(), b, e, &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: e.host, IsNotFound: true}})
		}, protocol.CheckUnreachable, []string{`cannot resolve host name "web01.example.com"`}},
		{"DNS failure", func(e endpoint) result {
			return dialFailure(context.Background(), b, e, &net.DNSError{Err: "server misbehaving", Name: e.host})
		}, protocol.CheckUnreachable, []string{"server misbehaving"}},
		{"connect timeout", func(e endpoint) result {
			return dialFailure(context.Background(), b, e, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded})
		}, protocol.CheckTimeout, []string{"within 5000 ms"}},
		{"other dial error with peer text", func(e endpoint) result {
			return dialFailure(context.Background(), b, e, errors.New(strings.Repeat("line\nof peer text ", 100)))
		}, protocol.CheckUnreachable, nil},
		{"certificate", func(e endpoint) result {
			return tlsFailure(context.Background(), b, e, &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}})
		}, protocol.CheckUnreachable, []string{"did not verify"}},
		{"not TLS", func(e endpoint) result {
			return tlsFailure(context.Background(), b, e, tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"})
		}, protocol.CheckUnreachable, []string{"does not answer with TLS"}},
		{"no WinRM answer", func(e endpoint) result {
			return winrmIOFailure(context.Background(), b, e, "https", os.ErrDeadlineExceeded)
		}, protocol.CheckTimeout, []string{"within 5000 ms"}},
		{"not tried", func(e endpoint) result {
			return notTried(context.Background(), b)
		}, protocol.CheckTimeout, []string{"5000 ms"}},
	}

	for _, tc := range cases {
		for kind, host := range hosts {
			t.Run(tc.name+"/"+kind, func(t *testing.T) {
				e := newEndpoint(protocol.CheckTarget{Host: host, Port: 2222}, defaultSSHPort)
				r := tc.make(e)
				msg := bound(r.message)
				if r.status != tc.status {
					t.Errorf("status %q, want %q", r.status, tc.status)
				}
				if len(msg) > MaxMessageBytes || !utf8.ValidString(msg) {
					t.Errorf("message of %d bytes (valid UTF-8: %v), want valid and at most %d: %q", len(msg), utf8.ValidString(msg), MaxMessageBytes, msg)
				}
				if i := strings.IndexFunc(msg, unicode.IsControl); i >= 0 {
					t.Errorf("message has a control character at byte %d: %q", i, msg)
				}
				for _, k := range keys {
					if strings.Contains(msg, base64.StdEncoding.EncodeToString(k.Marshal())[20:60]) {
						t.Errorf("message holds key material: %q", msg)
					}
				}
				if kind != "ordinary" {
					return
				}
				if strings.HasSuffix(msg, "...") && len(tc.parts) > 0 {
					t.Errorf("an ordinary message was cut: %q", msg)
				}
				for _, p := range tc.parts {
					if !strings.Contains(msg, p) {
						t.Errorf("message %q does not contain %q", msg, p)
					}
				}
			})
		}
	}
}

func TestBound(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{"short", "fine", "fine"},
		{"control characters", "a\nb\tc\x00d\x1b", "a b c d "},
		{"invalid UTF-8", "a\xffb", "a b"},
		{"exactly the limit", strings.Repeat("x", MaxMessageBytes), strings.Repeat("x", MaxMessageBytes)},
		{"one over", strings.Repeat("x", MaxMessageBytes+1), strings.Repeat("x", MaxMessageBytes-3) + "..."},
		// "é" is 2 bytes: the cut must not split one.
		{"multi-byte at the cut", "x" + strings.Repeat("é", MaxMessageBytes), "x" + strings.Repeat("é", (MaxMessageBytes-4)/2) + "..."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := bound(tc.in); got != tc.want {
				t.Errorf("bound(%.40q...) = %.60q... (%d bytes), want %.60q... (%d bytes)", tc.in, got, len(got), tc.want, len(tc.want))
			}
		})
	}
}

func TestAuthSchemes(t *testing.T) {
	cases := []struct {
		in   []string
		want string
	}{
		{[]string{"Negotiate", "Kerberos"}, "Negotiate, Kerberos"},
		{[]string{`Basic realm="WSMAN", Negotiate`}, "Basic, Negotiate"},
		{[]string{"negotiate abc==", "Negotiate"}, "negotiate"},
		{[]string{`Bearer realm="x, Basic"`}, ""},
		{[]string{"CredSSP"}, "CredSSP"},
		{nil, ""},
	}
	for _, tc := range cases {
		if got := strings.Join(authSchemes(tc.in), ", "); got != tc.want {
			t.Errorf("authSchemes(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzIsIdentifyResponse feeds the WinRM answer decoder arbitrary bodies: it must not panic,
// and must accept only bodies that hold an IdentifyResponse element in the wsmid namespace.
func FuzzIsIdentifyResponse(f *testing.F) {
	f.Add([]byte(`<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body><wsmid:IdentifyResponse xmlns:wsmid="` + wsmidNamespace + `"/></s:Body></s:Envelope>`))
	f.Add([]byte(`<IdentifyResponse xmlns="` + wsmidNamespace + `"/>`))
	f.Add([]byte(`<x:IdentifyResponse xmlns:x="urn:other"/>`))
	f.Add([]byte(`<html><body>It works!</body></html>`))
	f.Add([]byte(`<?xml version="1.0" encoding="UTF-16"?><a/>`))
	f.Add([]byte("\x00\xff<"))
	f.Fuzz(func(t *testing.T, body []byte) {
		ok, err := isIdentifyResponse(strings.NewReader(string(body)))
		if ok && (err != nil || !strings.Contains(string(body), "IdentifyResponse")) {
			t.Errorf("accepted %q (err %v)", body, err)
		}
	})
}
