package pinning_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

const testToken = "s3cret-token-0123456789-abcdef"

// fakeApp is a real HTTPS server standing in for the app's registration endpoint. Each request
// takes the next answer from answers; the last one repeats.
type fakeApp struct {
	srv      *httptest.Server
	requests atomic.Int32

	mu       sync.Mutex
	answers  []fakeAnswer
	received []protocol.RegisterRequest
	paths    []string
}

type fakeAnswer struct {
	status int
	body   string
	header map[string]string
}

func newFakeApp(t *testing.T, answers ...fakeAnswer) *fakeApp {
	t.Helper()
	a := &fakeApp{answers: answers}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(a.serve))
	t.Cleanup(func() {
		a.srv.Close()
		a.srv.Client().CloseIdleConnections()
	})
	return a
}

func (a *fakeApp) serve(w http.ResponseWriter, r *http.Request) {
	n := int(a.requests.Add(1))
	var req protocol.RegisterRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	a.mu.Lock()
	a.received = append(a.received, req)
	a.paths = append(a.paths, r.Method+" "+r.URL.Path)
	ans := a.answers[min(n, len(a.answers))-1]
	a.mu.Unlock()
	for k, v := range ans.header {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ans.status)
	_, _ = io.WriteString(w, ans.body)
}

// registrar builds a Registrar for appURL with fast retries and a log observer.
func registrar(t *testing.T, client *http.Client, appURL string, id *pinning.Identity) (*pinning.Registrar, *observer.ObservedLogs, *stateLog) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	states := &stateLog{}
	r := &pinning.Registrar{
		Client: client,
		AppURL: appURL,
		Request: protocol.RegisterRequest{
			Name: "rte01", URL: "https://rte01.example.com:8000", Token: testToken,
			Version: "1.2.3", MaxJobs: 10,
		},
		Logger:          zap.New(core),
		MinBackoff:      time.Millisecond,
		MaxBackoff:      5 * time.Millisecond,
		AttemptTimeout:  5 * time.Second,
		FailureLogEvery: time.Hour,
		OnState:         states.add,
	}
	if id != nil {
		r.Request.Certificate = string(id.PEM)
	}
	t.Cleanup(func() { assertNoSecretLogged(t, logs, testToken) })
	return r, logs, states
}

type stateLog struct {
	mu     sync.Mutex
	states []string
	seen   chan string
}

func (s *stateLog) add(state string) {
	s.mu.Lock()
	s.states = append(s.states, state)
	ch := s.seen
	s.mu.Unlock()
	if ch != nil {
		ch <- state
	}
}

func (s *stateLog) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.states)
}

// assertNoSecretLogged encodes every log entry as the production JSON encoder would and looks for
// the secret in it.
func assertNoSecretLogged(t *testing.T, logs *observer.ObservedLogs, secret string) {
	t.Helper()
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	for _, e := range logs.All() {
		buf, err := enc.EncodeEntry(e.Entry, e.Context)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(buf.String(), secret) {
			t.Errorf("log line contains the token: %s", buf.String())
		}
		buf.Free()
	}
}

func TestRegisterApproved(t *testing.T) {
	app := newFakeApp(t, fakeAnswer{status: 201, body: `{"state":"approved"}`})
	id := newIdentity(t, "rte01.example.com")
	r, logs, states := registrar(t, app.srv.Client(), app.srv.URL+"/af/", id)

	if err := r.Run(context.Background()); err != nil {
		t.Fatalf("Run = %v, want nil for 201 approved", err)
	}
	if got := app.requests.Load(); got != 1 {
		t.Errorf("app saw %d requests, want 1", got)
	}
	if want := []string{"POST /af" + protocol.RegisterPath}; !slices.Equal(app.paths, want) {
		t.Errorf("requests %q, want %q (APP_URL's path kept as a prefix)", app.paths, want)
	}
	got := app.received[0]
	if got.Token != testToken || got.Name != "rte01" || got.Certificate != string(id.PEM) || got.MaxJobs != 10 {
		t.Errorf("app received %+v, want the token, name, certificate and max_jobs sent", got)
	}
	if want := []string{pinning.StateRegistering, pinning.StateApproved}; !slices.Equal(states.get(), want) {
		t.Errorf("states %q, want %q", states.get(), want)
	}
	start := logs.FilterMessage("registering with app").All()
	if len(start) != 1 {
		t.Fatalf("want one 'registering with app' line, got %d", len(start))
	}
	fields := start[0].ContextMap()
	if fields["token_fingerprint"] != protocol.TokenFingerprint(testToken) || fields["certificate_fingerprint"] != id.Fingerprint() {
		t.Errorf("start line fields %v, want token fingerprint %s and certificate fingerprint %s",
			fields, protocol.TokenFingerprint(testToken), id.Fingerprint())
	}
	if n := logs.FilterMessageSnippet("approved").Len(); n != 1 {
		t.Errorf("want one line saying approved, got %d", n)
	}
}

func TestRegisterPending(t *testing.T) {
	id := newIdentity(t, "rte01.example.com")
	tokenFP := protocol.TokenFingerprint(testToken)
	tests := []struct {
		name      string
		body      string
		wantWarns []string
	}{
		{"fingerprints match", `{"state":"pending","token_fingerprint":"` + tokenFP + `","certificate_fingerprint":"` + id.Fingerprint() + `"}`, nil},
		{"someone else's token", `{"state":"pending","token_fingerprint":"dead-beef","certificate_fingerprint":"` + id.Fingerprint() + `"}`,
			[]string{"different token"}},
		{"another certificate", `{"state":"pending","token_fingerprint":"` + tokenFP + `","certificate_fingerprint":"0000-0000"}`,
			[]string{"different certificate"}},
		{"no fingerprints", `{"state":"pending"}`, []string{"no token fingerprint"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := newFakeApp(t, fakeAnswer{status: 202, body: tt.body})
			r, logs, states := registrar(t, app.srv.Client(), app.srv.URL, id)
			if err := r.Run(context.Background()); err != nil {
				t.Fatalf("Run = %v, want nil for 202 pending", err)
			}
			if want := []string{pinning.StateRegistering, pinning.StatePending}; !slices.Equal(states.get(), want) {
				t.Errorf("states %q, want %q", states.get(), want)
			}
			pending := logs.FilterMessageSnippet("registration pending").All()
			if len(pending) != 1 {
				t.Fatalf("want one 'registration pending' line, got %d", len(pending))
			}
			var resp protocol.RegisterResponse
			_ = json.Unmarshal([]byte(tt.body), &resp)
			f := pending[0].ContextMap()
			if f["app_token_fingerprint"] != resp.TokenFingerprint || f["app_certificate_fingerprint"] != resp.CertificateFingerprint {
				t.Errorf("pending line fields %v, want the fingerprints the app sent (%q, %q)", f, resp.TokenFingerprint, resp.CertificateFingerprint)
			}
			var warns []string
			for _, e := range logs.FilterLevelExact(zapcore.WarnLevel).All() {
				warns = append(warns, e.Message)
			}
			if len(warns) != len(tt.wantWarns) {
				t.Fatalf("warnings %q, want %d containing %q", warns, len(tt.wantWarns), tt.wantWarns)
			}
			for i, w := range tt.wantWarns {
				if !strings.Contains(warns[i], w) {
					t.Errorf("warning %q does not contain %q", warns[i], w)
				}
			}
		})
	}
}

func TestRegisterRefusedWithoutRetry(t *testing.T) {
	elsewhere := newFakeApp(t, fakeAnswer{status: 201, body: `{"state":"approved"}`})
	tests := []struct {
		name    string
		answer  fakeAnswer
		status  int
		wantErr []string
	}{
		{"certificate changed", fakeAnswer{status: 409, body: `{"error":"certificate changed on an approved runner"}`},
			409, []string{"409", "certificate changed on an approved runner", "approve the new certificate"}},
		{"bad join token", fakeAnswer{status: 400, body: `{"error":"join token not valid"}`},
			400, []string{"400", "join token not valid"}},
		{"too many waiting", fakeAnswer{status: 429, body: `{"error":"too many runners waiting"}`},
			429, []string{"429", "too many runners waiting"}},
		{"plain text error", fakeAnswer{status: 403, body: "forbidden by proxy"},
			403, []string{"403", "forbidden by proxy"}},
		{"error echoing the token", fakeAnswer{status: 400, body: `{"error":"token \u0073` + testToken[1:] + ` is malformed"}`},
			400, []string{"400", "[redacted] is malformed"}},
		{"huge error", fakeAnswer{status: 400, body: `{"error":"` + strings.Repeat("x", 1<<20) + `"}`},
			400, []string{"400", "xxx..."}},
		{"redirect", fakeAnswer{status: 307, header: map[string]string{"Location": elsewhere.srv.URL + protocol.RegisterPath}},
			307, []string{"307", "redirected to " + elsewhere.srv.URL, "set APP_URL"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := newFakeApp(t, tt.answer)
			r, logs, states := registrar(t, app.srv.Client(), app.srv.URL, nil)
			err := r.Run(context.Background())
			var refused *pinning.RefusedError
			if !errors.As(err, &refused) {
				t.Fatalf("Run = %v, want a *RefusedError", err)
			}
			if refused.Status != tt.status {
				t.Errorf("status %d, want %d", refused.Status, tt.status)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", clipForTest(err.Error()), w)
				}
			}
			if strings.Contains(err.Error(), testToken) {
				t.Errorf("error contains the token: %q", err)
			}
			if len(err.Error()) > 1000 {
				t.Errorf("error is %d bytes long, want text from the app clipped", len(err.Error()))
			}
			if got := app.requests.Load(); got != 1 {
				t.Errorf("app saw %d requests, want 1 (a refusal is not retried)", got)
			}
			if got := elsewhere.requests.Load(); got != 0 {
				t.Errorf("the redirect target saw %d requests, want 0 (the token must not follow a redirect)", got)
			}
			if want := []string{pinning.StateRegistering, pinning.StateRefused}; !slices.Equal(states.get(), want) {
				t.Errorf("states %q, want %q", states.get(), want)
			}
			if n := logs.FilterLevelExact(zapcore.ErrorLevel).Len(); n != 1 {
				t.Errorf("want one error line for the refusal, got %d", n)
			}
		})
	}
}

func TestRegisterRetriesServerErrors(t *testing.T) {
	app := newFakeApp(t,
		fakeAnswer{status: 503, body: "down"},
		fakeAnswer{status: 502, body: `{"error":"bad gateway"}`},
		fakeAnswer{status: 500, body: ""},
		fakeAnswer{status: 408, body: ""},
		fakeAnswer{status: 201, body: `{"state":"approved"}`},
	)
	r, logs, states := registrar(t, app.srv.Client(), app.srv.URL, nil)
	if err := r.Run(context.Background()); err != nil {
		t.Fatalf("Run = %v, want nil after the app recovered", err)
	}
	if got := app.requests.Load(); got != 5 {
		t.Errorf("app saw %d requests, want 5 (four failures, then the approval)", got)
	}
	if want := []string{pinning.StateRegistering, pinning.StateUnreachable, pinning.StateApproved}; !slices.Equal(states.get(), want) {
		t.Errorf("states %q, want %q", states.get(), want)
	}
	// A run of failures is logged when it starts, not once per attempt, and its end is logged.
	warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
	if len(warns) != 1 {
		t.Fatalf("want 1 warning for the run of 4 failures, got %d", len(warns))
	}
	if cause, _ := warns[0].ContextMap()["cause"].(string); !strings.Contains(cause, "503") {
		t.Errorf("warning cause %q, want the first failure's status 503", cause)
	}
	again := logs.FilterMessage("app reachable again").All()
	if len(again) != 1 || again[0].ContextMap()["failed_attempts"] != int64(4) {
		t.Errorf("want one 'app reachable again' line with failed_attempts 4, got %v", again)
	}
}

// TestRegisterNoAnswerThenUp starts with nothing listening on the app's address, then brings the
// app up on that same address.
func TestRegisterNoAnswerThenUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	var requests atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(201)
		_, _ = io.WriteString(w, `{"state":"approved"}`)
	}))
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	r, logs, states := registrar(t, client, "http://"+addr, nil)
	states.seen = make(chan string, 10)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()

	waitState(t, states.seen, pinning.StateUnreachable)
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	srv.Listener = ln
	srv.Start()
	defer srv.Close()

	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil once the app answers", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20 s after the app came up")
	}
	if got := requests.Load(); got != 1 {
		t.Errorf("app saw %d requests, want 1", got)
	}
	warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
	if len(warns) != 1 || !strings.Contains(warns[0].ContextMap()["cause"].(string), "connection refused") {
		t.Errorf("want one warning naming the refused connection, got %v", warns)
	}
}

func TestRegisterStopsWhenCanceled(t *testing.T) {
	app := newFakeApp(t, fakeAnswer{status: 503})
	r, _, states := registrar(t, app.srv.Client(), app.srv.URL, nil)
	states.seen = make(chan string, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitState(t, states.seen, pinning.StateUnreachable)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of cancel")
	}
	if app.requests.Load() < 1 {
		t.Errorf("app saw no request")
	}
}

func TestRegisterRefusesBadSettings(t *testing.T) {
	tests := []struct {
		name   string
		appURL string
		token  string
		want   string
	}{
		{"not a URL", "app.example.com", testToken, "not an http:// or https:// URL"},
		{"wrong scheme", "ftp://app.example.com", testToken, "not an http:// or https:// URL"},
		{"no token", "https://app.example.com", "", "no token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &pinning.Registrar{AppURL: tt.appURL, Request: protocol.RegisterRequest{Token: tt.token}}
			if err := r.Run(context.Background()); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func waitState(t *testing.T, seen <-chan string, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case s := <-seen:
			if s == want {
				return
			}
		case <-timeout:
			t.Fatalf("state %q not reached within 10 s", want)
		}
	}
}

func clipForTest(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}
