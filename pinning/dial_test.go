package pinning_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

const runnerToken = "runner-token-0123456789"

// fakeRunner is a real TLS (or plain) WebSocket server standing in for an inbound RTE.
type fakeRunner struct {
	srv      *httptest.Server
	requests atomic.Int32 // HTTP requests that reached the handler: any of them carried the token

	mu      sync.Mutex
	headers []http.Header

	closeCodes chan int // close code of each upgraded socket, once its client is gone
	handlers   sync.WaitGroup
}

type runnerOptions struct {
	noSubprotocol bool // upgrade without echoing rte.v1
	status        int  // answer this status instead of upgrading
	sendBytes     int  // after the upgrade, send one text message this long
}

// startRunner serves on ln (a fresh 127.0.0.1:0 listener when nil) with TLS when id is set.
func startRunner(t *testing.T, ln net.Listener, id *pinning.Identity, opts runnerOptions) *fakeRunner {
	t.Helper()
	r := &fakeRunner{closeCodes: make(chan int, 10)}
	upgrader := websocket.Upgrader{}
	if !opts.noSubprotocol {
		upgrader.Subprotocols = []string{protocol.Subprotocol}
	}
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.handlers.Add(1)
		defer r.handlers.Done()
		r.requests.Add(1)
		r.mu.Lock()
		r.headers = append(r.headers, req.Header.Clone())
		r.mu.Unlock()
		if opts.status != 0 {
			http.Error(w, "unknown token", opts.status)
			return
		}
		conn, err := upgrader.Upgrade(w, req, nil)
		if err != nil {
			return
		}
		defer conn.Close()
		if opts.sendBytes > 0 {
			_ = conn.WriteMessage(websocket.TextMessage, bytes.Repeat([]byte("a"), opts.sendBytes))
		}
		for {
			if _, _, err := conn.ReadMessage(); err != nil {
				code := -1
				var ce *websocket.CloseError
				if errors.As(err, &ce) {
					code = ce.Code
				}
				r.closeCodes <- code
				return
			}
		}
	}))
	// Refused handshakes are what several tests expect; the server need not report them.
	r.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if ln != nil {
		r.srv.Listener.Close()
		r.srv.Listener = ln
	}
	if id != nil {
		r.srv.TLS = &tls.Config{Certificates: []tls.Certificate{id.Certificate}}
		r.srv.StartTLS()
	} else {
		r.srv.Start()
	}
	t.Cleanup(r.close)
	return r
}

// close stops the server and waits for its handlers: Close does not wait for hijacked sockets,
// so the test must close its client side first.
func (r *fakeRunner) close() {
	r.srv.Close()
	r.handlers.Wait()
}

func (r *fakeRunner) lastHeader() http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.headers) == 0 {
		return nil
	}
	return r.headers[len(r.headers)-1]
}

func dialer() *pinning.Dialer {
	return &pinning.Dialer{Token: runnerToken, Node: "app-1", Timeout: 10 * time.Second}
}

func TestDialMatchingPin(t *testing.T) {
	id := newIdentity(t, "rte01.example.com") // the app dials 127.0.0.1: the name need not match
	runner := startRunner(t, nil, id, runnerOptions{})

	conn, presented, err := dialer().Dial(context.Background(), runner.srv.URL, pinning.Pin{DER: id.DER})
	if err != nil {
		t.Fatalf("Dial with the matching pin: %v", err)
	}
	if !bytes.Equal(presented, id.DER) {
		t.Errorf("presented DER is not the runner's certificate")
	}
	if conn.Subprotocol() != protocol.Subprotocol {
		t.Errorf("subprotocol %q, want %q", conn.Subprotocol(), protocol.Subprotocol)
	}
	h := runner.lastHeader()
	if got := h.Get("Authorization"); got != "Bearer "+runnerToken {
		t.Errorf("runner saw Authorization %q, want the bearer token", got)
	}
	if got := h.Get(protocol.HeaderAppNode); got != "app-1" {
		t.Errorf("runner saw %s %q, want %q", protocol.HeaderAppNode, got, "app-1")
	}
	_ = conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	if code := <-runner.closeCodes; code != websocket.CloseNormalClosure {
		t.Errorf("runner saw close code %d, want %d", code, websocket.CloseNormalClosure)
	}
	conn.Close()
}

// TestDialRefusesAnotherCertificateAtTheSameAddress replaces the runner by an impostor with its
// own self-signed certificate on the same address and port: the app must refuse it before
// sending the token.
func TestDialRefusesAnotherCertificateAtTheSameAddress(t *testing.T) {
	approved := newIdentity(t, "127.0.0.1")
	impostorID := newIdentity(t, "127.0.0.1")
	first := startRunner(t, nil, approved, runnerOptions{})
	runnerURL := first.srv.URL
	addr := first.srv.Listener.Addr().String()

	conn, _, err := dialer().Dial(context.Background(), runnerURL, pinning.Pin{DER: approved.DER})
	if err != nil {
		t.Fatalf("Dial the approved runner: %v", err)
	}
	conn.Close()
	first.close()

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	impostor := startRunner(t, ln, impostorID, runnerOptions{})

	conn, presented, err := dialer().Dial(context.Background(), runnerURL, pinning.Pin{DER: approved.DER})
	if err == nil {
		conn.Close()
		t.Fatal("Dial accepted a runner whose certificate is not the pinned one")
	}
	var mismatch *pinning.MismatchError
	if !errors.As(err, &mismatch) {
		t.Fatalf("Dial = %v, want a *MismatchError", err)
	}
	if presented != nil {
		t.Errorf("Dial returned presented DER beside an error")
	}
	if mismatch.Expected != approved.Fingerprint() || mismatch.Presented != impostorID.Fingerprint() ||
		mismatch.ExpectedSHA256 != approved.SHA256() || mismatch.PresentedSHA256 != impostorID.SHA256() {
		t.Errorf("mismatch %+v, want expected %s and presented %s", mismatch, approved.Fingerprint(), impostorID.Fingerprint())
	}
	if !bytes.Equal(mismatch.PresentedDER, impostorID.DER) {
		t.Errorf("PresentedDER is not the impostor's certificate")
	}
	for _, want := range []string{approved.Fingerprint(), impostorID.Fingerprint(), "token was not sent"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if n := impostor.requests.Load(); n != 0 {
		t.Errorf("impostor received %d HTTP requests, want 0: the token leaked", n)
	}
}

func TestDialSHA256Pin(t *testing.T) {
	id := newIdentity(t, "127.0.0.1")
	other := newIdentity(t, "127.0.0.1")
	runner := startRunner(t, nil, id, runnerOptions{})

	// Operators copy fingerprints in many shapes; upper case with colons is a common one.
	var colons []string
	for i := 0; i < len(id.SHA256()); i += 2 {
		colons = append(colons, strings.ToUpper(id.SHA256()[i:i+2]))
	}
	conn, presented, err := dialer().Dial(context.Background(), runner.srv.URL, pinning.Pin{SHA256: strings.Join(colons, ":")})
	if err != nil {
		t.Fatalf("Dial with a matching SHA-256 pin: %v", err)
	}
	if !bytes.Equal(presented, id.DER) {
		t.Errorf("presented DER is not the runner's certificate: the caller could not store it as the pin")
	}
	conn.Close()
	<-runner.closeCodes

	_, _, err = dialer().Dial(context.Background(), runner.srv.URL, pinning.Pin{SHA256: other.SHA256()})
	var mismatch *pinning.MismatchError
	if !errors.As(err, &mismatch) {
		t.Fatalf("Dial with another certificate's SHA-256 = %v, want a *MismatchError", err)
	}
	if mismatch.Expected != other.Fingerprint() || mismatch.Presented != id.Fingerprint() {
		t.Errorf("mismatch names %s and %s, want %s and %s", mismatch.Expected, mismatch.Presented, other.Fingerprint(), id.Fingerprint())
	}
	if n := runner.requests.Load(); n != 1 {
		t.Errorf("runner received %d requests, want 1 (only the matching dial)", n)
	}
}

func TestDialUnpinned(t *testing.T) {
	id := newIdentity(t, "127.0.0.1")
	runner := startRunner(t, nil, id, runnerOptions{})
	_, _, err := dialer().Dial(context.Background(), runner.srv.URL, pinning.Pin{})
	var unpinned *pinning.UnpinnedError
	if !errors.As(err, &unpinned) {
		t.Fatalf("Dial without a pin = %v, want an *UnpinnedError", err)
	}
	if !bytes.Equal(unpinned.PresentedDER, id.DER) {
		t.Errorf("PresentedDER is not the runner's certificate")
	}
	if !strings.Contains(err.Error(), id.Fingerprint()) {
		t.Errorf("error %q does not name the presented fingerprint %s", err, id.Fingerprint())
	}
	if n := runner.requests.Load(); n != 0 {
		t.Errorf("runner received %d HTTP requests, want 0: the token must not go to an unapproved certificate", n)
	}
}

func TestDialWithoutSubprotocol(t *testing.T) {
	id := newIdentity(t, "127.0.0.1")
	runner := startRunner(t, nil, id, runnerOptions{noSubprotocol: true})
	conn, _, err := dialer().Dial(context.Background(), runner.srv.URL, pinning.Pin{DER: id.DER})
	if err == nil {
		conn.Close()
		t.Fatal("Dial accepted a server that did not echo the subprotocol")
	}
	if !strings.Contains(err.Error(), "subprotocol "+protocol.Subprotocol) {
		t.Errorf("error %q does not name the missing subprotocol", err)
	}
	select {
	case code := <-runner.closeCodes:
		if code != protocol.CloseProtocolError {
			t.Errorf("server saw close code %d, want %d", code, protocol.CloseProtocolError)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server saw no close within 10 s")
	}
}

func TestDialTokenRefused(t *testing.T) {
	id := newIdentity(t, "127.0.0.1")
	runner := startRunner(t, nil, id, runnerOptions{status: http.StatusUnauthorized})
	_, _, err := dialer().Dial(context.Background(), runner.srv.URL, pinning.Pin{DER: id.DER})
	if err == nil {
		t.Fatal("Dial succeeded against a 401")
	}
	for _, want := range []string{"refused the token (401)", "unknown token", "RTE_TOKEN"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), runnerToken) {
		t.Errorf("error contains the token: %q", err)
	}
}

func TestDialPlainHTTP(t *testing.T) {
	runner := startRunner(t, nil, nil, runnerOptions{})
	conn, presented, err := dialer().Dial(context.Background(), runner.srv.URL+"/", pinning.Pin{})
	if err != nil {
		t.Fatalf("Dial an http:// runner: %v", err)
	}
	if presented != nil {
		t.Errorf("presented DER %d bytes over plain http, want none", len(presented))
	}
	conn.Close()
	<-runner.closeCodes

	id := newIdentity(t, "127.0.0.1")
	_, _, err = dialer().Dial(context.Background(), runner.srv.URL, pinning.Pin{DER: id.DER})
	if err == nil || !strings.Contains(err.Error(), "not https://") {
		t.Errorf("Dial an http:// runner with a pin = %v, want a refusal (the token would go in the clear)", err)
	}
	if n := runner.requests.Load(); n != 1 {
		t.Errorf("runner received %d requests, want 1 (none for the refused dial)", n)
	}
}

func TestDialReadLimit(t *testing.T) {
	id := newIdentity(t, "127.0.0.1")
	runner := startRunner(t, nil, id, runnerOptions{sendBytes: pinning.ReadLimit + 1})
	conn, _, err := dialer().Dial(context.Background(), runner.srv.URL, pinning.Pin{DER: id.DER})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = conn.ReadMessage()
	conn.Close() // unblocks the runner, still writing the rest of the message
	if !errors.Is(err, websocket.ErrReadLimit) {
		t.Errorf("reading a message of %d bytes = %v, want %v", pinning.ReadLimit+1, err, websocket.ErrReadLimit)
	}
	<-runner.closeCodes
}

// TestDialTimeout dials a listener that accepts and never answers the TLS handshake.
func TestDialTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	defer func() {
		ln.Close()
		<-accepted
		for _, c := range held {
			c.Close()
		}
	}()
	d := dialer()
	d.Timeout = 100 * time.Millisecond
	_, _, err = d.Dial(context.Background(), "https://"+ln.Addr().String(), pinning.Pin{SHA256: strings.Repeat("a", 64)})
	if err == nil || !strings.Contains(err.Error(), "no answer within 100ms") {
		t.Errorf("Dial a silent peer = %v, want an error saying no answer came within the timeout", err)
	}
}

func TestDialRefusesBadInput(t *testing.T) {
	tests := []struct {
		name, url string
		token     string
		pin       pinning.Pin
		want      string
	}{
		{"relative URL", "rte01:8000", runnerToken, pinning.Pin{}, "not an absolute"},
		{"ftp scheme", "ftp://rte01:8000", runnerToken, pinning.Pin{}, "scheme"},
		{"credentials in URL", "https://user:pw@rte01:8000", runnerToken, pinning.Pin{}, "credentials"},
		{"no token", "https://rte01:8000", "", pinning.Pin{}, "no token"},
		{"short fingerprint as pin", "https://rte01:8000", runnerToken, pinning.Pin{SHA256: "abcd-ef12"}, "64 hex digits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := dialer()
			d.Token = tt.token
			_, _, err := d.Dial(context.Background(), tt.url, tt.pin)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Dial = %v, want an error containing %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "pw@") {
				t.Errorf("error %q repeats the password from the URL", err)
			}
		})
	}
}
