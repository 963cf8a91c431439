package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	token        = "0123456789abcdef-token"
	metricsToken = "metrics-token-0123456789"
	waitLimit    = 10 * time.Second // safety net, not a measurement
)

// acceptor keeps every socket handed to it, with the request it came with.
type acceptor struct {
	got chan accepted
}

type accepted struct {
	ws      *websocket.Conn
	appNode string
}

func newAcceptor() *acceptor { return &acceptor{got: make(chan accepted, 8)} }

func (a *acceptor) Accept(ws *websocket.Conn, r *http.Request) {
	a.got <- accepted{ws, r.Header.Get(protocol.HeaderAppNode)}
}

// closeAll closes the sockets accepted so far.
func (a *acceptor) closeAll() {
	for {
		select {
		case s := <-a.got:
			_ = s.ws.Close()
		default:
			return
		}
	}
}

type fixture struct {
	srv  *server.Server
	reg  *prometheus.Registry
	acc  *acceptor
	url  string // http://127.0.0.1:port
	http *http.Client
}

// newFixture mounts a Server's handler on an httptest server on 127.0.0.1:0.
func newFixture(t *testing.T, edit func(*server.Config)) *fixture {
	t.Helper()
	f := &fixture{reg: prometheus.NewRegistry(), acc: newAcceptor()}
	cfg := server.Config{Token: token, Registry: f.reg, Version: "1.2.3", Sockets: f.acc}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.srv = srv
	hs := httptest.NewServer(srv.Handler())
	f.url = hs.URL
	// No keep-alive: an idle pooled connection would outlive the test and trip goleak.
	f.http = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: waitLimit}
	t.Cleanup(func() {
		f.acc.closeAll()
		hs.Close()
	})
	return f
}

// get sends method path with an optional bearer token and returns the status and body.
func (f *fixture) get(t *testing.T, method, path, bearer string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, f.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := f.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// counter reads one sample of a counter or gauge family from reg; 0 when absent.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			return value(m)
		}
	}
	return 0
}

func value(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

func dialSocket(url string, header http.Header, subprotocols ...string) (*websocket.Conn, *http.Response, error) {
	d := websocket.Dialer{Subprotocols: subprotocols, HandshakeTimeout: waitLimit}
	ws, resp, err := d.Dial("ws"+strings.TrimPrefix(url, "http")+protocol.SocketPath, header)
	if resp != nil {
		_ = resp.Body.Close()
	}
	return ws, resp, err
}

func TestSocketRefusesMissingOrWrongToken(t *testing.T) {
	for _, tc := range []struct {
		name, authorization, reason string
	}{
		{"no header", "", "missing"},
		{"basic scheme", "Basic " + token, "missing"},
		{"empty bearer", "Bearer ", "missing"},
		{"wrong token", "Bearer " + token + "x", "wrong"},
		{"prefix of token", "Bearer " + token[:16], "wrong"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, nil)
			h := http.Header{}
			if tc.authorization != "" {
				h.Set("Authorization", tc.authorization)
			}
			ws, resp, err := dialSocket(f.url, h, protocol.Subprotocol)
			if err == nil {
				_ = ws.Close()
				t.Fatal("dial with a bad token upgraded, want 401")
			}
			if resp == nil || resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("dial with a bad token: %v, want status 401", err)
			}
			if resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			labels := map[string]string{"endpoint": "socket", "reason": tc.reason}
			if got := counter(t, f.reg, "rte_auth_failures_total", labels); got != 1 {
				t.Fatalf("rte_auth_failures_total%v = %v, want 1", labels, got)
			}
			select {
			case <-f.acc.got:
				t.Fatal("the Acceptor got a socket that failed the token check")
			default:
			}
		})
	}
}

func TestSocketNeedsSubprotocol(t *testing.T) {
	f := newFixture(t, nil)
	h := http.Header{"Authorization": {"Bearer " + token}}
	ws, resp, err := dialSocket(f.url, h) // no subprotocol asked for
	if err == nil {
		_ = ws.Close()
		t.Fatal("dial without subprotocol upgraded, want 400")
	}
	if resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("dial without subprotocol: %v, want status 400", err)
	}
	// The body names what to ask for.
	req, _ := http.NewRequest(http.MethodGet, f.url+protocol.SocketPath, nil)
	req.Header = h
	r, err := f.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if r.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), protocol.Subprotocol) {
		t.Fatalf("GET without subprotocol: %d %q, want 400 naming %s", r.StatusCode, body, protocol.Subprotocol)
	}
}

func TestSocketUpgradeHandsToAcceptor(t *testing.T) {
	f := newFixture(t, nil)
	h := http.Header{"Authorization": {"bearer " + token}, protocol.HeaderAppNode: {"app-1"}}
	ws, _, err := dialSocket(f.url, h, "other", protocol.Subprotocol)
	if err != nil {
		t.Fatalf("dial with the right token: %v", err)
	}
	defer ws.Close()
	if got := ws.Subprotocol(); got != protocol.Subprotocol {
		t.Fatalf("subprotocol %q, want %q echoed", got, protocol.Subprotocol)
	}
	select {
	case a := <-f.acc.got:
		defer a.ws.Close()
		if a.appNode != "app-1" {
			t.Fatalf("Acceptor saw X-App-Node %q, want app-1", a.appNode)
		}
		// The socket the Acceptor got is the one the client holds.
		if err := a.ws.WriteMessage(websocket.TextMessage, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		_ = ws.SetReadDeadline(time.Now().Add(waitLimit))
		if _, data, err := ws.ReadMessage(); err != nil || string(data) != "hi" {
			t.Fatalf("client read %q, %v; want hi", data, err)
		}
	case <-time.After(waitLimit):
		t.Fatal("the Acceptor got no socket")
	}
	if got := counter(t, f.reg, "rte_auth_failures_total", nil); got != 0 {
		t.Fatalf("rte_auth_failures_total = %v after a good dial, want 0", got)
	}
}

func TestProbes(t *testing.T) {
	var notReady atomic.Pointer[error]
	f := newFixture(t, func(c *server.Config) {
		c.Ready = func() error {
			if p := notReady.Load(); p != nil {
				return *p
			}
			return nil
		}
	})
	spoolErr := errors.New("spool not open")
	notReady.Store(&spoolErr)

	check := func(step, method, path string, wantStatus int, wantBody string) {
		t.Helper()
		status, body := f.get(t, method, path, "")
		if status != wantStatus || !strings.Contains(body, wantBody) {
			t.Fatalf("%s: %s %s = %d %q, want %d containing %q", step, method, path, status, body, wantStatus, wantBody)
		}
	}
	check("serving", "GET", "/live", 200, "ok")
	check("Ready errs", "GET", "/ready", 503, "spool not open")
	notReady.Store(nil)
	check("Ready nil", "GET", "/ready", 200, "ready")
	check("head", "HEAD", "/ready", 200, "")
	check("post live", "POST", "/live", 405, "")
	check("put ready", "PUT", "/ready", 405, "")
	check("delete metrics without METRICS_TOKEN", "DELETE", "/metrics", 404, "")
	req, _ := http.NewRequest("POST", f.url+"/ready", nil)
	resp, err := f.http.Do(req)
	if err != nil {
		t.Fatalf("POST /ready: %v", err)
	}
	_ = resp.Body.Close()
	if got := resp.Header.Get("Allow"); got != "GET, HEAD" {
		t.Fatalf("POST /ready: Allow %q, want %q", got, "GET, HEAD")
	}
	check("unknown path", "GET", "/nope", 404, "")
	check("root", "GET", "/", 404, "")
	f.srv.SetDraining()
	check("draining", "GET", "/ready", 503, "draining")
	check("draining live", "GET", "/live", 200, "ok")
}

func TestMetricsToken(t *testing.T) {
	t.Run("unset", func(t *testing.T) {
		f := newFixture(t, nil)
		for _, bearer := range []string{"", "anything"} {
			if status, _ := f.get(t, "GET", "/metrics", bearer); status != 404 {
				t.Fatalf("/metrics without METRICS_TOKEN, bearer %q: %d, want 404", bearer, status)
			}
		}
	})
	t.Run("set", func(t *testing.T) {
		f := newFixture(t, func(c *server.Config) { c.MetricsToken = metricsToken })
		for _, tc := range []struct{ bearer, reason string }{{"", "missing"}, {"wrong", "wrong"}, {token, "wrong"}} {
			if status, _ := f.get(t, "GET", "/metrics", tc.bearer); status != 401 {
				t.Fatalf("/metrics with bearer %q: %d, want 401", tc.bearer, status)
			}
		}
		if status, _ := f.get(t, "POST", "/metrics", metricsToken); status != 405 {
			t.Fatalf("POST /metrics with METRICS_TOKEN: %d, want 405", status)
		}
		if got := counter(t, f.reg, "rte_auth_failures_total", map[string]string{"endpoint": "metrics", "reason": "wrong"}); got != 2 {
			t.Fatalf("rte_auth_failures_total{endpoint=metrics,reason=wrong} = %v, want 2", got)
		}
		f.srv.SetRegistrationState("pending")
		f.srv.SetRegistrationState("approved")
		status, body := f.get(t, "GET", "/metrics", metricsToken)
		if status != 200 {
			t.Fatalf("/metrics with METRICS_TOKEN: %d, want 200", status)
		}
		for _, want := range []string{
			`rte_build_info{goversion="go`,
			`version="1.2.3"} 1`,
			`rte_auth_failures_total{endpoint="metrics",reason="missing"} 1`,
			`rte_registration_state{state="approved"} 1`,
			`rte_registration_state{state="pending"} 0`,
			`go_goroutines `,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics body lacks %q", want)
			}
		}
	})
}

func TestMetricsLint(t *testing.T) {
	f := newFixture(t, nil)
	f.srv.SetRegistrationState("approved")
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "rte_") {
			t.Errorf("metric %s: %s", p.Metric, p.Text)
		}
	}
}

func TestNewRefusals(t *testing.T) {
	// A caller may have registered the Go and process collectors already.
	shared := prometheus.NewRegistry()
	shared.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if _, err := server.New(server.Config{Token: token, Sockets: newAcceptor(), Registry: shared}); err != nil {
		t.Fatalf("first New on a registry with the Go and process collectors: %v", err)
	}
	for _, tc := range []struct {
		name string
		cfg  server.Config
		want string
	}{
		{"no token", server.Config{Sockets: newAcceptor()}, "RTE_TOKEN"},
		{"short token", server.Config{Token: "short", Sockets: newAcceptor()}, "at least 16"},
		{"registry taken", server.Config{Token: token, Sockets: newAcceptor(), Registry: shared}, "register metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := server.New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error mentioning %q", err, tc.want)
			}
			if strings.Contains(err.Error(), token) {
				t.Fatalf("New's error %q contains the token", err)
			}
		})
	}
}

// selfSigned makes a TLS certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "rte-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// TestServeTLSShutdown serves over real TLS, then shuts down: /ready turns 503 while the pause
// lasts, the listener closes after it, and an upgraded socket outlives Serve.
func TestServeTLSShutdown(t *testing.T) {
	cert, pool := selfSigned(t)
	acc := newAcceptor()
	defer acc.closeAll()
	srv, err := server.New(server.Config{Token: token, Sockets: acc, ShutdownPause: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	inPause, release := make(chan struct{}), make(chan struct{})
	srv.SetPause(func(time.Duration) {
		close(inPause)
		<-release
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- srv.Serve(ctx, tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	}()

	tlsConf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf, DisableKeepAlives: true}, Timeout: waitLimit}
	status := func(path string) (int, error) {
		resp, err := client.Get("https://" + addr + path)
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := status("/ready"); err != nil || code != 200 {
		t.Fatalf("/ready while serving: %d %v, want 200", code, err)
	}

	d := websocket.Dialer{TLSClientConfig: tlsConf, Subprotocols: []string{protocol.Subprotocol}, HandshakeTimeout: waitLimit}
	ws, resp, err := d.Dial("wss://"+addr+protocol.SocketPath, http.Header{"Authorization": {"Bearer " + token}})
	if err != nil {
		t.Fatalf("wss dial: %v", err)
	}
	_ = resp.Body.Close()
	defer ws.Close()
	var held accepted
	select {
	case held = <-acc.got:
	case <-time.After(waitLimit):
		t.Fatal("the Acceptor got no socket")
	}

	cancel()
	select {
	case <-inPause:
	case <-time.After(waitLimit):
		t.Fatal("Serve did not reach the shutdown pause")
	}
	if code, err := status("/ready"); err != nil || code != 503 {
		t.Fatalf("/ready during the shutdown pause: %d %v, want 503", code, err)
	}
	if code, err := status("/live"); err != nil || code != 200 {
		t.Fatalf("/live during the shutdown pause: %d %v, want 200", code, err)
	}
	close(release)
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve after shutdown: %v, want nil", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Serve did not return after the pause; it must not wait for the upgraded socket")
	}
	if _, err := status("/live"); err == nil {
		t.Fatal("/live answered after Serve returned; the listener should be closed")
	}
	// The upgraded socket is the Acceptor's and still works.
	if err := held.ws.WriteMessage(websocket.TextMessage, []byte("still here")); err != nil {
		t.Fatalf("write on the upgraded socket after Serve returned: %v", err)
	}
	_ = ws.SetReadDeadline(time.Now().Add(waitLimit))
	if _, data, err := ws.ReadMessage(); err != nil || string(data) != "still here" {
		t.Fatalf("client read %q, %v after Serve returned; want the socket kept open", data, err)
	}
	_ = held.ws.Close()
}

func TestServeListenerFailure(t *testing.T) {
	srv, err := server.New(server.Config{Token: token, Sockets: newAcceptor()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = ln.Close()
	if err := srv.Serve(context.Background(), ln); err == nil {
		t.Fatal("Serve on a closed listener returned nil, want the listener's error")
	}
	if err := srv.Serve(context.Background(), ln); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("second Serve: %v, want an error saying it was called twice", err)
	}
}

// TestConcurrentAuthFailures hammers the token check from many goroutines under -race.
func TestConcurrentAuthFailures(t *testing.T) {
	f := newFixture(t, nil)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", f.url+protocol.SocketPath, nil)
			req.Header.Set("Authorization", "Bearer nope")
			if resp, err := f.http.Do(req); err == nil {
				_ = resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	if got := counter(t, f.reg, "rte_auth_failures_total", map[string]string{"endpoint": "socket", "reason": "wrong"}); got != 20 {
		t.Fatalf("rte_auth_failures_total{socket,wrong} = %v after 20 refusals, want 20", got)
	}
}

func TestRefusalLogsNoToken(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	f := newFixture(t, func(c *server.Config) {
		c.Logger = zap.New(core)
		c.MetricsToken = metricsToken
	})
	presented := "guess-" + token
	if _, resp, err := dialSocket(f.url, http.Header{"Authorization": {"Bearer " + presented}}, protocol.Subprotocol); err == nil || resp.StatusCode != 401 {
		t.Fatalf("dial with a wrong token: %v, want 401", err)
	}
	f.get(t, "GET", "/metrics", presented)
	entries := logs.All()
	if len(entries) < 2 {
		t.Fatalf("%d log entries for two refusals, want at least 2", len(entries))
	}
	for _, e := range entries {
		line := e.Message + fmt.Sprint(e.ContextMap())
		for _, secret := range []string{presented, token, metricsToken} {
			if strings.Contains(line, secret) {
				t.Fatalf("log entry %q contains a token", line)
			}
		}
	}
}

func TestNoAcceptorNoSocketPath(t *testing.T) {
	f := newFixture(t, func(c *server.Config) { c.Sockets = nil })
	ws, resp, err := dialSocket(f.url, http.Header{"Authorization": {"Bearer " + token}}, protocol.Subprotocol)
	if err == nil {
		_ = ws.Close()
		t.Fatal("dial upgraded without an Acceptor, want 404")
	}
	if resp == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("dial without an Acceptor: %v, want status 404", err)
	}
	if status, _ := f.get(t, "GET", "/live", ""); status != 200 {
		t.Fatalf("/live without an Acceptor: %d, want 200", status)
	}
}
