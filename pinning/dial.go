package pinning

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/protocol"
)

// ReadLimit is the read limit set on every connection Dial returns. The largest message the
// protocol allows is a text frame of protocol.MaxMessageBytes; a bundle frame (41 header bytes
// and at most protocol.MaxChunkPayload) is far smaller. The few bytes of slack let a message
// just over the limit reach the codec, which answers it with a clear error, instead of the
// socket dropping it.
const ReadLimit = protocol.MaxMessageBytes + 64

// defaultDialTimeout bounds the TCP connect, TLS handshake and WebSocket upgrade together when
// Dialer.Timeout is zero.
const defaultDialTimeout = 15 * time.Second

// Pin is what the app trusts for one inbound runner. DER wins when both are set.
type Pin struct {
	DER    []byte // the approved certificate; the presented leaf must equal it byte for byte
	SHA256 string // or: the full SHA-256 of a certificate not seen yet (hand-made or seeded runner), in any form protocol.ParseSHA256Fingerprint accepts
}

// IsZero reports whether the pin trusts nothing yet.
func (p Pin) IsZero() bool { return len(p.DER) == 0 && p.SHA256 == "" }

// MismatchError is a runner whose certificate is not the pinned one. The token was not sent.
type MismatchError struct {
	Expected, Presented             string // short fingerprints, "abcd-ef12"
	ExpectedSHA256, PresentedSHA256 string // full SHA-256, 64 hex digits
	PresentedDER                    []byte // the leaf the runner presented, for an approval dialog
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("runner certificate is not the approved one: expected %s (sha256 %s), presented %s (sha256 %s); the token was not sent; if the runner's certificate was replaced on purpose, approve the new one",
		e.Expected, e.ExpectedSHA256, e.Presented, e.PresentedSHA256)
}

// UnpinnedError is a runner dialed over TLS with no pin at all: the app should show the presented
// certificate for approval (trust on first use) and dial again once it is approved. The token was
// not sent.
type UnpinnedError struct {
	PresentedDER []byte
}

func (e *UnpinnedError) Error() string {
	return fmt.Sprintf("runner certificate %s (sha256 %s) is not approved yet: approve it after comparing fingerprints with the runner's log, then dial again; the token was not sent",
		protocol.CertificateFingerprint(e.PresentedDER), protocol.CertificateSHA256(e.PresentedDER))
}

// Dialer opens the app's side of an inbound socket (PROTOCOL.md section 1). A Dialer holds no
// state between calls and is safe for concurrent use.
type Dialer struct {
	Token   string                                // the runner's RTE_TOKEN, sent as Authorization: Bearer
	Node    string                                // this app node's id, sent as X-App-Node
	Timeout time.Duration                         // connect, TLS handshake and upgrade together; 15 s when zero
	Proxy   func(*http.Request) (*url.URL, error) // optional, e.g. http.ProxyFromEnvironment
}

// Dial opens wss://host/rte/v1/socket for an https:// runner URL (ws:// for http://; a path in
// the URL is kept as a prefix) asking for subprotocol rte.v1.
//
// Over TLS it returns the connection only when the presented leaf certificate is byte for byte
// pin.DER, or, when pin.DER is nil, when the leaf's full SHA-256 is pin.SHA256; it also returns
// the presented DER, which the caller stores as the new pin after a SHA-256 match. A certificate
// that does not match is a *MismatchError; no pin at all is an *UnpinnedError. Both are decided
// inside the TLS handshake, before the HTTP request that carries the token is written.
//
// A plain http:// runner URL with a pin is refused: the runner was approved with a certificate,
// and dialing it without TLS would send the token in the clear to whoever answers.
//
// The returned connection has a read limit of ReadLimit; the caller owns it and closes it.
func (d *Dialer) Dial(ctx context.Context, runnerURL string, pin Pin) (*websocket.Conn, []byte, error) {
	socketURL, useTLS, err := socketURL(runnerURL)
	if err != nil {
		return nil, nil, err
	}
	if d.Token == "" {
		return nil, nil, fmt.Errorf("dial runner %s: no token to send (the runner's RTE_TOKEN)", socketURL)
	}
	wantSHA := ""
	if len(pin.DER) == 0 && pin.SHA256 != "" {
		if wantSHA, err = protocol.ParseSHA256Fingerprint(pin.SHA256); err != nil {
			return nil, nil, fmt.Errorf("dial runner %s: %w", socketURL, err)
		}
	}
	if !useTLS && !pin.IsZero() {
		return nil, nil, fmt.Errorf("dial runner %s: a certificate is pinned for this runner but its URL is not https://: change the runner URL back to https://, or remove the pin if TLS was turned off on purpose", socketURL)
	}

	// presented and verifyErr are written by VerifyConnection during the handshake and read after
	// DialContext returns, on this goroutine: the handshake happens-before the return.
	var presented []byte
	var verifyErr error
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = defaultDialTimeout
	}
	wsDialer := &websocket.Dialer{
		Proxy:            d.Proxy,
		HandshakeTimeout: timeout,
		Subprotocols:     []string{protocol.Subprotocol},
		TLSClientConfig: &tls.Config{
			MinVersion: tls.VersionTLS12,
			// Pinning replaces CA verification: the runner's certificate is usually
			// self-signed and the app may reach it by a name or address the certificate does
			// not list, so chain and hostname checks would refuse good runners. That is the
			// only reason InsecureSkipVerify is set; VerifyConnection below still runs on
			// every handshake (resumed ones included) and accepts exactly the approved
			// certificate, which is stricter than any CA check.
			InsecureSkipVerify: true,
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 {
					verifyErr = errors.New("runner presented no certificate")
					return verifyErr
				}
				leaf := cs.PeerCertificates[0].Raw
				presented = bytes.Clone(leaf)
				verifyErr = checkPin(presented, pin.DER, wantSHA)
				return verifyErr
			},
		},
	}
	header := http.Header{}
	header.Set("Authorization", "Bearer "+d.Token)
	if d.Node != "" {
		header.Set(protocol.HeaderAppNode, d.Node)
	}
	conn, resp, err := wsDialer.DialContext(ctx, socketURL, header)
	if err != nil {
		if verifyErr != nil {
			return nil, nil, fmt.Errorf("dial runner %s: %w", socketURL, verifyErr)
		}
		var netErr net.Error
		if ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout())) {
			return nil, nil, fmt.Errorf("dial runner %s: no answer within %v: check that the runner listens at this address and that no firewall drops the traffic: %w", socketURL, timeout, err)
		}
		return nil, nil, answerError(socketURL, resp, err, d.Token)
	}
	if conn.Subprotocol() != protocol.Subprotocol {
		got := conn.Subprotocol()
		_ = conn.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(protocol.CloseProtocolError, "subprotocol "+protocol.Subprotocol+" required"),
			time.Now().Add(time.Second))
		_ = conn.Close()
		return nil, nil, fmt.Errorf("dial runner %s: runner did not accept subprotocol %s (answered %q): it does not speak this protocol version, or something other than an RTE answered", socketURL, protocol.Subprotocol, protocol.PeerText(got, 100))
	}
	conn.SetReadLimit(ReadLimit)
	return conn, presented, nil
}

// checkPin decides whether the presented leaf is the approved one.
func checkPin(presented, pinDER []byte, pinSHA string) error {
	switch {
	case len(pinDER) > 0:
		if bytes.Equal(presented, pinDER) {
			return nil
		}
		return &MismatchError{
			Expected:        protocol.CertificateFingerprint(pinDER),
			Presented:       protocol.CertificateFingerprint(presented),
			ExpectedSHA256:  protocol.CertificateSHA256(pinDER),
			PresentedSHA256: protocol.CertificateSHA256(presented),
			PresentedDER:    presented,
		}
	case pinSHA != "":
		sum := sha256.Sum256(presented)
		got := hex.EncodeToString(sum[:])
		if subtle.ConstantTimeCompare([]byte(got), []byte(pinSHA)) == 1 {
			return nil
		}
		return &MismatchError{
			Expected:        pinSHA[:4] + "-" + pinSHA[4:8], // the short form of the same digest
			Presented:       protocol.CertificateFingerprint(presented),
			ExpectedSHA256:  pinSHA,
			PresentedSHA256: got,
			PresentedDER:    presented,
		}
	default:
		return &UnpinnedError{PresentedDER: presented}
	}
}

// socketURL turns a runner URL into its socket URL and says whether it uses TLS.
func socketURL(runnerURL string) (string, bool, error) {
	u, err := url.Parse(runnerURL)
	if err != nil || u.Host == "" {
		return "", false, fmt.Errorf("runner URL %q is not an absolute https:// or http:// URL", protocol.PeerText(runnerURL, 200))
	}
	var useTLS bool
	switch strings.ToLower(u.Scheme) {
	case "https", "wss":
		u.Scheme, useTLS = "wss", true
	case "http", "ws":
		u.Scheme = "ws"
	default:
		return "", false, fmt.Errorf("runner URL %q: scheme %q is not https or http", protocol.PeerText(runnerURL, 200), u.Scheme)
	}
	if u.User != nil {
		return "", false, fmt.Errorf("runner URL %q carries credentials: remove them, the token is the runner's credential", u.Redacted())
	}
	u.Path = strings.TrimRight(u.Path, "/") + protocol.SocketPath
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	return u.String(), useTLS, nil
}

// answerError explains a dial that failed after, or without, the TLS check. The answer's text is
// bounded and cleared of the token, in case the peer echoes the request.
func answerError(socketURL string, resp *http.Response, err error, token string) error {
	if resp == nil {
		return fmt.Errorf("dial runner %s: %w", socketURL, err)
	}
	var text string
	if resp.Body != nil {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		redact := func(s string) string { return strings.ReplaceAll(s, token, "[redacted]") }
		text = strings.TrimSpace(peerText(string(body), redact))
	}
	suffix := ""
	if text != "" {
		suffix = ": " + text
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return fmt.Errorf("dial runner %s: the runner refused the token (401)%s; the token stored for this runner must be the runner's RTE_TOKEN", socketURL, suffix)
	}
	return fmt.Errorf("dial runner %s: runner answered %d %s instead of upgrading to a WebSocket%s", socketURL, resp.StatusCode, http.StatusText(resp.StatusCode), suffix)
}
