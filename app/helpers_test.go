package app_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/apptest"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

const (
	testNode  = "app-1"
	testToken = "rte-token-0123456789abcdef"
	testJoin  = "join-token-0123456789abcdef"
)

// clock is the injectable Now of the tests: waiting 24 h costs nothing.
type clock = testenv.Clock

func newClock() *clock { return testenv.NewClock(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)) }

// testCert is a self-signed certificate for 127.0.0.1, like the one an RTE generates.
type testCert struct {
	tls tls.Certificate
	der []byte
	pem string
}

// newCert is apptest.SelfSigned, kept with its DER and PEM forms that the tests compare.
func newCert(t testing.TB) testCert {
	t.Helper()
	c, err := apptest.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	der := c.Certificate[0]
	return testCert{
		tls: c,
		der: der,
		pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
	}
}

// testApp builds an App on a memory store with a clock and a log observer, and serves its
// handler on a real socket.
type testApp struct {
	*app.App
	store app.Store
	clock *clock
	logs  *observer.ObservedLogs
	srv   *httptest.Server
}

func newTestApp(t testing.TB, edit func(*app.Config)) *testApp {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	ta := &testApp{store: app.NewMemoryStore(), clock: newClock(), logs: logs}
	cfg := app.Config{
		Store:        ta.store,
		Logger:       zap.New(core),
		Node:         testNode,
		JoinToken:    testJoin,
		Now:          ta.clock.Now,
		DialTimeout:  5 * time.Second,
		HelloTimeout: 5 * time.Second,
	}
	if edit != nil {
		edit(&cfg)
	}
	a, err := app.New(cfg)
	if err != nil {
		t.Fatalf("app.New: %v", err)
	}
	ta.App = a
	ta.srv = httptest.NewServer(a.Handler())
	t.Cleanup(func() {
		ta.srv.Close()
		assertNoSecretLogged(t, logs, testToken, testJoin)
	})
	return ta
}

// post sends one registration as raw bytes and decodes the answer.
func (ta *testApp) post(t testing.TB, body []byte) (int, protocol.RegisterResponse) {
	t.Helper()
	resp, err := ta.srv.Client().Post(ta.srv.URL+protocol.RegisterPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("post registration: %v", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	var out protocol.RegisterResponse
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("answer %d is not JSON: %q", resp.StatusCode, data)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("answer Content-Type = %q, want application/json", ct)
	}
	return resp.StatusCode, out
}

func (ta *testApp) register(t testing.TB, req protocol.RegisterRequest) (int, protocol.RegisterResponse) {
	t.Helper()
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return ta.post(t, body)
}

func (ta *testApp) runner(t testing.TB, name string) *app.Runner {
	t.Helper()
	r, err := ta.store.GetRunner(context.Background(), name)
	if err != nil {
		t.Fatalf("get runner %q: %v", name, err)
	}
	return r
}

// assertNoSecretLogged fails when any log line carries a secret, in its message or any field.
func assertNoSecretLogged(t testing.TB, logs *observer.ObservedLogs, secrets ...string) {
	t.Helper()
	for _, e := range logs.All() {
		text := e.Message + " " + fmt.Sprint(e.ContextMap())
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("log line %q carries a secret: %s", e.Message, text)
			}
		}
	}
}

// fakeRTE is the fake RTE of package apptest in raw mode, just enough of an RTE: it checks
// the bearer token and X-App-Node before upgrading, echoes rte.v1, sends a hello given as
// bytes, and hands the test what the app sent.
type fakeRTE struct {
	*apptest.RTE
	addr     string
	upgrades <-chan struct{}
}

// startFakeRTE listens on addr ("127.0.0.1:0" for a fresh port); with cert nil it speaks
// plain HTTP. hello nil sends no hello. edits change the config last (another token, say).
func startFakeRTE(t testing.TB, addr string, cert *testCert, hello []byte, edits ...func(*apptest.Config)) *fakeRTE {
	t.Helper()
	cfg := apptest.Config{Token: testToken, Addr: addr, AppNode: testNode, Raw: true, RawHello: hello, PlainHTTP: cert == nil}
	if cert != nil {
		cfg.Certificate = &cert.tls
	}
	for _, edit := range edits {
		edit(&cfg)
	}
	r := apptest.Start(t, cfg)
	return &fakeRTE{RTE: r, addr: r.Addr(), upgrades: r.Upgrades()}
}

func (f *fakeRTE) url() string { return f.URL() }

// send writes one text frame to the app on the newest socket.
func (f *fakeRTE) send(t testing.TB, frame string) {
	t.Helper()
	if err := f.SendRaw([]byte(frame)); err != nil {
		t.Fatalf("fake RTE send: %v", err)
	}
}

// seen returns the headers of every request that reached the RTE over HTTP.
func (f *fakeRTE) seen() []http.Header { return f.Requests() }

// frame waits for the next text frame the app sent.
func (f *fakeRTE) frame(t testing.TB) []byte {
	t.Helper()
	select {
	case b := <-f.Frames():
		return b
	case <-time.After(10 * time.Second):
		t.Fatal("fake RTE got no frame from the app within 10s")
		return nil
	}
}

// closeCode waits for the close code the app sent.
func (f *fakeRTE) closeCode(t testing.TB) int {
	t.Helper()
	select {
	case c := <-f.Closes():
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("fake RTE saw no close frame from the app within 10s")
		return 0
	}
}

func helloFrame(t testing.TB, protocolVersion int) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"type": "hello", "protocol": protocolVersion, "name": "rte01", "version": "1.2.3",
		"instance": "host1", "mode": "inbound", "files": "transfer", "max_jobs": 10,
		"running": []string{}, "spooled": []any{}, "token_fingerprint": protocol.TokenFingerprint(testToken),
		"ansible_version": "2.14.18", "images": []string{"rte:dev", "registry.example/ee-*:*"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decodeFrame(t testing.TB, b []byte) protocol.Message {
	t.Helper()
	m, err := protocol.Decode(b)
	if err != nil {
		t.Fatalf("frame from the app %q does not decode: %v", b, err)
	}
	return m
}
