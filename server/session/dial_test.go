package session_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/session"
)

const (
	dialToken = "dial-token-0123456789abcdef"
	dialJoin  = "dial-join-0123456789abcdef"
)

// fakeEndpoint is the app's outbound socket endpoint: it counts and keeps every request, answers
// with refuse's status when it gives one, and otherwise upgrades and runs behave on the socket.
type fakeEndpoint struct {
	srv    *httptest.Server
	refuse func(n int) (status int, body string)
	behave func(ws *websocket.Conn)

	dials atomic.Int32
	wg    sync.WaitGroup // handlers, which outlive the server's Close once they hijacked

	mu       sync.Mutex
	requests []*http.Request
}

func (f *fakeEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.wg.Add(1)
	defer f.wg.Done()
	n := int(f.dials.Add(1))
	f.mu.Lock()
	f.requests = append(f.requests, r.Clone(context.Background()))
	f.mu.Unlock()
	if f.refuse != nil {
		if status, body := f.refuse(n); status != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
			return
		}
	}
	up := websocket.Upgrader{Subprotocols: []string{protocol.Subprotocol}}
	ws, err := up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer ws.Close()
	if f.behave != nil {
		f.behave(ws)
	}
}

func (f *fakeEndpoint) firstRequest(t *testing.T) *http.Request {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		t.Fatal("the app saw no request")
	}
	return f.requests[0]
}

// newEndpoint serves f on 127.0.0.1; tlsCert, when given, turns on TLS with it.
func newEndpoint(t *testing.T, f *fakeEndpoint, tlsCert *tls.Certificate) *fakeEndpoint {
	t.Helper()
	f.srv = httptest.NewUnstartedServer(f)
	if tlsCert != nil {
		f.srv.TLS = &tls.Config{Certificates: []tls.Certificate{*tlsCert}}
		f.srv.StartTLS()
	} else {
		f.srv.Start()
	}
	t.Cleanup(func() {
		f.srv.Close()
		f.wg.Wait()
	})
	return f
}

// welcomeThen reads the hello, welcomes it, sends msgs, then closes with code (0: keeps the
// socket until the RTE closes it).
func welcomeThen(approved bool, code int, reason string, msgs ...protocol.Message) func(*websocket.Conn) {
	return func(ws *websocket.Conn) {
		_ = ws.SetReadDeadline(time.Now().Add(waitLimit))
		if _, data, err := ws.ReadMessage(); err != nil {
			return
		} else if m, err := protocol.Decode(data); err != nil || m.Type() != protocol.TypeHello {
			return
		}
		all := append([]protocol.Message{&protocol.Welcome{Protocol: protocol.Version, Node: "app-1", Approved: approved}}, msgs...)
		for _, m := range all {
			b, _ := protocol.Encode(m)
			if ws.WriteMessage(websocket.TextMessage, b) != nil {
				return
			}
		}
		if code != 0 {
			_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
		}
		for { // until the RTE's close, or its answer to ours
			_ = ws.SetReadDeadline(time.Now().Add(waitLimit))
			if _, _, err := ws.ReadMessage(); err != nil {
				return
			}
		}
	}
}

// logged observes the dialer's and the session's log lines.
func logged() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.DebugLevel)
	return zap.New(core), logs
}

func outboundManager(logger *zap.Logger) *session.Manager {
	hello := staticHello
	hello.Mode = protocol.ModeOutbound
	return session.NewManager(session.Config{Logger: logger, Hello: hello, Jobs: newJobs(2)})
}

// runDialer runs d until the test ends, and checks that Run then returns nil.
func runDialer(t *testing.T, d *session.Dialer, m *session.Manager) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, m) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run after its context ended: %v, want nil", err)
			}
		case <-time.After(waitLimit):
			t.Errorf("Run did not return within %s of its context ending", waitLimit)
		}
	})
}

func count(logs *observer.ObservedLogs, level zapcore.Level, msg string) int {
	n := 0
	for _, e := range logs.All() {
		if e.Level == level && strings.Contains(e.Message, msg) {
			n++
		}
	}
	return n
}

func errorField(logs *observer.ObservedLogs, msg string) string {
	for _, e := range logs.All() {
		if strings.Contains(e.Message, msg) {
			if v, ok := e.ContextMap()["error"].(string); ok {
				return v
			}
		}
	}
	return ""
}

func assertNoSecret(t *testing.T, logs *observer.ObservedLogs) {
	t.Helper()
	for _, e := range logs.All() {
		line := e.Message + fmt.Sprint(e.ContextMap())
		if strings.Contains(line, dialToken) || strings.Contains(line, dialJoin) {
			t.Fatalf("a log line carries a token: %q", line)
		}
	}
}

func TestOutboundURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"https://forms.example.com", "wss://forms.example.com/api/v2/rte/socket"},
		{"http://127.0.0.1:8080", "ws://127.0.0.1:8080/api/v2/rte/socket"},
		{"https://forms.example.com/af/", "wss://forms.example.com/af/api/v2/rte/socket"},
		{"HTTPS://forms.example.com:8443/af", "wss://forms.example.com:8443/af/api/v2/rte/socket"},
	} {
		got, err := session.OutboundURL(c.in)
		if err != nil || got != c.want {
			t.Errorf("OutboundURL(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "forms.example.com", "ftp://forms.example.com", "https://user:pw@forms.example.com", "https://"} {
		if got, err := session.OutboundURL(bad); err == nil {
			t.Errorf("OutboundURL(%q) = %q, want an error", bad, got)
		} else if strings.Contains(err.Error(), "pw") {
			t.Errorf("OutboundURL(%q): the error shows the password: %v", bad, err)
		}
	}
}

func TestDialerRefusesBadSettings(t *testing.T) {
	m := outboundManager(zap.NewNop())
	for name, d := range map[string]session.Dialer{
		"bad url":     {AppURL: "ftp://app", Token: dialToken, Name: "rte01"},
		"short token": {AppURL: "http://127.0.0.1:1", Token: "short", Name: "rte01"},
		"no name":     {AppURL: "http://127.0.0.1:1", Token: dialToken},
	} {
		if err := d.Run(context.Background(), m); err == nil {
			t.Errorf("%s: Run returned nil, want an error at once", name)
		}
	}
}

// TestDialerHeadersAndRedial checks what the dial carries and that the RTE dials again after
// the app closes a welcomed socket, again and again.
func TestDialerHeadersAndRedial(t *testing.T) {
	f := newEndpoint(t, &fakeEndpoint{behave: welcomeThen(true, websocket.CloseNormalClosure, "bye")}, nil)
	logger, logs := logged()
	d := &session.Dialer{AppURL: f.srv.URL + "/", Token: dialToken, Name: "rte01", JoinToken: dialJoin,
		Logger: logger, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
	runDialer(t, d, outboundManager(logger))
	eventually(t, "dialled three times", func() bool { return f.dials.Load() >= 3 })

	r := f.firstRequest(t)
	for _, h := range []struct{ name, want string }{
		{"Authorization", "Bearer " + dialToken},
		{protocol.HeaderRTEName, "rte01"},
		{protocol.HeaderJoinToken, dialJoin},
	} {
		if got := r.Header.Get(h.name); got != h.want {
			t.Errorf("header %s = %q, want %q", h.name, got, h.want)
		}
	}
	if r.URL.Path != protocol.OutboundSocketPath {
		t.Errorf("dialled path %q, want %q", r.URL.Path, protocol.OutboundSocketPath)
	}
	if !slices.Contains(websocket.Subprotocols(r), protocol.Subprotocol) {
		t.Errorf("subprotocols %v, want %s among them", websocket.Subprotocols(r), protocol.Subprotocol)
	}
	if n := count(logs, zapcore.WarnLevel, ""); n != 0 {
		t.Errorf("%d warnings for sockets the app closed normally after its welcome, want none: %v", n, logs.FilterLevelExact(zapcore.WarnLevel).All())
	}
	assertNoSecret(t, logs)
}

func TestDialerWithoutJoinTokenSendsNoHeader(t *testing.T) {
	f := newEndpoint(t, &fakeEndpoint{behave: welcomeThen(true, 0, "")}, nil)
	m := outboundManager(zap.NewNop())
	runDialer(t, &session.Dialer{AppURL: f.srv.URL, Token: dialToken, Name: "rte01"}, m)
	eventually(t, "welcomed", func() bool { _, ok := m.Welcomed(); return ok })
	if v, ok := f.firstRequest(t).Header[protocol.HeaderJoinToken]; ok {
		t.Fatalf("%s sent as %q without a join token", protocol.HeaderJoinToken, v)
	}
}

// TestDialerTokenRefused: a 401 is logged once with the app's reason, and tried again only
// every MaxBackoff, not at MinBackoff.
func TestDialerTokenRefused(t *testing.T) {
	f := newEndpoint(t, &fakeEndpoint{refuse: func(int) (int, string) {
		return http.StatusUnauthorized, `{"error":"the token (fingerprint abcd-ef12) belongs to no runner"}`
	}}, nil)
	logger, logs := logged()
	const maxWait = 100 * time.Millisecond
	d := &session.Dialer{AppURL: f.srv.URL, Token: dialToken, Name: "rte01", Logger: logger,
		MinBackoff: time.Millisecond, MaxBackoff: maxWait, RejectedBackoff: time.Hour}
	runDialer(t, d, outboundManager(logger))
	eventually(t, "dialled three times", func() bool { return f.dials.Load() >= 3 })

	before := f.dials.Load()
	time.Sleep(5 * maxWait)
	if extra := f.dials.Load() - before; extra > 6 {
		t.Fatalf("%d dials in 5 max backoffs after a 401, want at most 6: the RTE hammers the app", extra)
	}
	if n := count(logs, zapcore.WarnLevel, "refused this runner's token"); n != 1 {
		t.Fatalf("%d warnings about the refused token, want 1 for the whole run", n)
	}
	if got := errorField(logs, "refused this runner's token"); !strings.Contains(got, "belongs to no runner") || !strings.Contains(got, "401") {
		t.Fatalf("the warning's error %q does not carry the app's status and reason", got)
	}
	assertNoSecret(t, logs)
}

// TestDialerRefused: a 403 is logged with its reason and not tried again before
// RejectedBackoff, even with MinBackoff and MaxBackoff short.
func TestDialerRefused(t *testing.T) {
	f := newEndpoint(t, &fakeEndpoint{refuse: func(int) (int, string) {
		return http.StatusForbidden, `{"error":"X-RTE-Join-Token is not the app's join token"}`
	}}, nil)
	logger, logs := logged()
	d := &session.Dialer{AppURL: f.srv.URL, Token: dialToken, Name: "rte01", JoinToken: "wrong-join-0123456789",
		Logger: logger, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, RejectedBackoff: time.Hour}
	runDialer(t, d, outboundManager(logger))
	eventually(t, "dialled", func() bool { return f.dials.Load() >= 1 })
	time.Sleep(300 * time.Millisecond) // 60 max backoffs
	if n := f.dials.Load(); n != 1 {
		t.Fatalf("%d dials after a 403, want 1 until the rejected backoff passes", n)
	}
	if got := errorField(logs, "the app refused this runner"); !strings.Contains(got, "not the app's join token") {
		t.Fatalf("the 403 was logged with %q, want the app's reason; logs: %v", got, logs.All())
	}
}

// TestDialerRejectedWhileWaiting: the app welcomes a waiting runner, then rejects it and closes
// with 4003; the RTE logs the reason and stays away for RejectedBackoff.
func TestDialerRejectedWhileWaiting(t *testing.T) {
	f := newEndpoint(t, &fakeEndpoint{behave: welcomeThen(false, protocol.CloseRejected, "rejected: unknown host",
		&protocol.Rejected{Reason: "unknown host"})}, nil)
	logger, logs := logged()
	d := &session.Dialer{AppURL: f.srv.URL, Token: dialToken, Name: "rte01", Logger: logger,
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, RejectedBackoff: time.Hour}
	runDialer(t, d, outboundManager(logger))
	eventually(t, "the rejection logged", func() bool { return count(logs, zapcore.WarnLevel, "the app rejected this runner and removed it") == 1 })
	time.Sleep(300 * time.Millisecond)
	if n := f.dials.Load(); n != 1 {
		t.Fatalf("%d dials after the app rejected the runner, want 1 until the rejected backoff passes", n)
	}
	for _, e := range logs.FilterMessageSnippet("the app rejected this runner and removed it").All() {
		if reason, _ := e.ContextMap()["reason"].(string); !strings.Contains(reason, "unknown host") {
			t.Fatalf("rejection logged with reason %q, want the app's", reason)
		}
	}
}

// TestDialerLogsAnOutageOnce: many failed dials make one warning, and the welcome that ends
// them one line saying the app is back.
func TestDialerLogsAnOutageOnce(t *testing.T) {
	const failures = 15
	f := newEndpoint(t, &fakeEndpoint{
		refuse: func(n int) (int, string) {
			if n <= failures {
				return http.StatusServiceUnavailable, `{"error":"starting"}`
			}
			return 0, ""
		},
		behave: welcomeThen(true, 0, ""),
	}, nil)
	logger, logs := logged()
	m := outboundManager(logger)
	d := &session.Dialer{AppURL: f.srv.URL, Token: dialToken, Name: "rte01", Logger: logger,
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	runDialer(t, d, m)
	eventually(t, "welcomed", func() bool { _, ok := m.Welcomed(); return ok })
	eventually(t, "the recovery logged", func() bool { return count(logs, zapcore.InfoLevel, "the app is reachable again") == 1 })
	if n := count(logs, zapcore.WarnLevel, "the app did not take the socket"); n != 1 {
		t.Fatalf("%d warnings for %d failed dials, want 1", n, failures)
	}
	if n := count(logs, zapcore.DebugLevel, "the app did not take the socket"); n != failures-1 {
		t.Fatalf("%d debug lines for the repeated failures, want %d", n, failures-1)
	}
	e := logs.FilterMessageSnippet("the app is reachable again").All()[0]
	if got := e.ContextMap()["failed_attempts"]; got != int64(failures) {
		t.Fatalf("recovery logged failed_attempts=%v, want %d", got, failures)
	}
}

func TestDialerUnreachableLoggedOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	logger, logs := logged()
	d := &session.Dialer{AppURL: "http://" + addr, Token: dialToken, Name: "rte01", Logger: logger,
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	runDialer(t, d, outboundManager(logger))
	eventually(t, "ten failed dials", func() bool { return count(logs, zapcore.DebugLevel, "cannot reach the app") >= 10 })
	if n := count(logs, zapcore.WarnLevel, "cannot reach the app"); n != 1 {
		t.Fatalf("%d warnings for a run of failed dials, want 1", n)
	}
	if got := errorField(logs, "cannot reach the app"); !strings.Contains(got, "refused") {
		t.Fatalf("the warning's error %q does not name the cause", got)
	}
}

// TestDialerThroughConnectProxy dials a name only the proxy can resolve: the socket can only
// have come through the proxy.
func TestDialerThroughConnectProxy(t *testing.T) {
	f := newEndpoint(t, &fakeEndpoint{behave: welcomeThen(true, 0, "")}, nil)
	_, port, _ := net.SplitHostPort(f.srv.Listener.Addr().String())
	appHost := "app.rte-test.invalid:" + port
	px := testenv.StartConnectProxy(t, map[string]string{appHost: f.srv.Listener.Addr().String()})
	proxyURL, _ := url.Parse("http://" + px.Addr())

	logger, logs := logged()
	m := outboundManager(logger)
	d := &session.Dialer{AppURL: "http://" + appHost, Token: dialToken, Name: "rte01", Logger: logger,
		Proxy: http.ProxyURL(proxyURL)}
	runDialer(t, d, m)
	eventually(t, "welcomed through the proxy", func() bool { _, ok := m.Welcomed(); return ok })
	if got := px.Seen(); len(got) != 1 || got[0] != appHost {
		t.Fatalf("the proxy was asked to CONNECT to %v, want [%s]", got, appHost)
	}
	start := logs.FilterMessage("dialling the app").All()
	if len(start) != 1 || start[0].ContextMap()["proxy"] != proxyURL.String() {
		t.Fatalf("start line %v does not name the proxy %s", start, proxyURL)
	}
}

// testCA is a private certificate authority, as a company runs for its internal services.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rte test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// leaf issues a server certificate for 127.0.0.1 and localhost.
func (ca *testCA) leaf(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "app"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestDialerTLS(t *testing.T) {
	ca := newTestCA(t)
	leaf := ca.leaf(t)
	f := newEndpoint(t, &fakeEndpoint{behave: welcomeThen(true, 0, "")}, &leaf)
	if !strings.HasPrefix(f.srv.URL, "https://") {
		t.Fatalf("the app endpoint is %s, want https", f.srv.URL)
	}

	t.Run("private CA trusted", func(t *testing.T) {
		m := outboundManager(zap.NewNop())
		runDialer(t, &session.Dialer{AppURL: f.srv.URL, Token: dialToken, Name: "rte01",
			TLS: &tls.Config{RootCAs: ca.pool}}, m)
		eventually(t, "welcomed over TLS", func() bool { _, ok := m.Welcomed(); return ok })
	})

	t.Run("private CA not trusted", func(t *testing.T) {
		before := f.dials.Load()
		logger, logs := logged()
		m := outboundManager(logger)
		runDialer(t, &session.Dialer{AppURL: f.srv.URL, Token: dialToken, Name: "rte01", Logger: logger,
			MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}, m)
		eventually(t, "several failed dials", func() bool { return count(logs, zapcore.DebugLevel, "NODE_EXTRA_CA_CERTS") >= 3 })
		if n := count(logs, zapcore.WarnLevel, "NODE_EXTRA_CA_CERTS"); n != 1 {
			t.Fatalf("%d warnings naming NODE_EXTRA_CA_CERTS, want 1", n)
		}
		if _, ok := m.Welcomed(); ok {
			t.Fatal("welcomed by an app whose certificate no trusted CA signed")
		}
		if n := f.dials.Load() - before; n != 0 {
			t.Fatalf("the app saw %d requests from an RTE that could not verify it: the token went out", n)
		}
	})

	t.Run("verification off", func(t *testing.T) {
		m := outboundManager(zap.NewNop())
		runDialer(t, &session.Dialer{AppURL: f.srv.URL, Token: dialToken, Name: "rte01",
			TLS: &tls.Config{InsecureSkipVerify: true}}, m)
		eventually(t, "welcomed without verification", func() bool { _, ok := m.Welcomed(); return ok })
	})
}

// TestDialerApprovedWithoutReconnect: a waiting runner takes no job, then takes one once the
// app approves it, on the same socket.
func TestDialerApprovedWithoutReconnect(t *testing.T) {
	appSide := make(chan *websocket.Conn, 1)
	release := make(chan struct{})
	f := newEndpoint(t, &fakeEndpoint{behave: func(ws *websocket.Conn) {
		appSide <- ws
		<-release
	}}, nil)
	m := outboundManager(zap.NewNop())
	runDialer(t, &session.Dialer{AppURL: f.srv.URL, Token: dialToken, Name: "rte01"}, m)
	// Runs before the dialer stops: the app's side closes, so the RTE's close is answered at once.
	t.Cleanup(func() { close(release) })

	a := &app{t: t, ws: <-appSide}
	w := approved
	w.Approved = false
	a.handshake(w)
	a.send(&protocol.JobStart{Job: "j1", Playbook: "site.yml"})
	if r := expect[*protocol.JobRefused](a); r.Code != protocol.RefusedNotApproved {
		t.Fatalf("job on a waiting runner refused %q, want %q", r.Code, protocol.RefusedNotApproved)
	}
	a.send(&protocol.Approved{})
	a.send(&protocol.JobStart{Job: "j2", Playbook: "site.yml"})
	if acc := expect[*protocol.JobAccepted](a); acc.Job != "j2" {
		t.Fatalf("accepted %q, want j2", acc.Job)
	}
	if n := f.dials.Load(); n != 1 {
		t.Fatalf("%d dials, want the one socket", n)
	}
}
