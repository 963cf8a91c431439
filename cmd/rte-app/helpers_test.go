package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rte-project/rte/internal/logging"

	"go.uber.org/goleak"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
	"github.com/rte-project/rte/protocol"
)

func TestMain(m *testing.M) {
	// Tests need not wait for the production keepalive and reconnect pacing.
	streamKeepalive = 50 * time.Millisecond
	goleak.VerifyTestMain(m)
}

const (
	testAdminToken = "admin-token-must-not-leak-5e1b9c0d"
	// testRunnerToken is the hand-added runner's RTE_TOKEN.
	testRunnerToken = "runner-token-must-not-leak-77aa31"
)

// syncBuffer is a bytes.Buffer safe for the logger's and the test's goroutines.
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

// testApp is the reference app's server (serveApp, as `rte-app serve` runs it) on a real
// socket with a real SQLite store, and one approved runner, "r1", that never answers: its
// jobs stay queued, and a test stores their records itself to play the runner.
type testApp struct {
	URL   string
	App   *app.App
	Store *sqlitestore.Store
	Logs  *syncBuffer
}

func startTestApp(t *testing.T) *testApp {
	t.Helper()
	store, err := sqlitestore.Open(filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	logger, err := logging.New("debug", "json", logs)
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(app.Config{Store: store, Logger: logger, Node: "test-app", RedialMin: time.Hour, RedialMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// A port nothing listens on: the app's dials fail at once, and its redial waits an hour.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "https://" + dead.Addr().String()
	dead.Close()
	if err := a.AddRunner(context.Background(), &app.Runner{Name: "r1", URL: deadURL, Token: testRunnerToken}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveApp(ctx, a, ln, testAdminToken, logger) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serveApp returned %v, want nil after its context ended", err)
		}
		store.Close()
		for _, leak := range []string{testAdminToken, testRunnerToken} {
			if strings.Contains(logs.String(), leak) {
				t.Errorf("a token reached the log:\n%s", logs.String())
			}
		}
	})
	return &testApp{URL: "http://" + ln.Addr().String(), App: a, Store: store, Logs: logs}
}

// call sends a request with the admin token and returns the status and body.
func (ta *testApp) call(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	return ta.callAs(t, method, path, body, "Bearer "+testAdminToken)
}

func (ta *testApp) callAs(t *testing.T, method, path, body, authorization string) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, ta.URL+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// submit queues a job on r1 through the API and returns it.
func (ta *testApp) submit(t *testing.T, body string) jobView {
	t.Helper()
	status, b := ta.call(t, http.MethodPost, "/api/v2/jobs", body)
	if status != http.StatusCreated {
		t.Fatalf("POST /api/v2/jobs %s: got %d %s, want 201", body, status, b)
	}
	var j jobView
	if err := json.Unmarshal(b, &j); err != nil {
		t.Fatal(err)
	}
	return j
}

// storeRecords plays the runner: it stores records for job as the app would on receiving them.
func (ta *testApp) storeRecords(t *testing.T, job string, recs ...protocol.Record) {
	t.Helper()
	for i := range recs {
		recs[i].Job = job
		if recs[i].At.IsZero() {
			recs[i].At = time.Now().UTC()
		}
	}
	if _, err := ta.Store.StoreRecords(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
}

func record(t *testing.T, seq int64, kind string, data any) protocol.Record {
	t.Helper()
	b, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	return protocol.Record{Seq: seq, Kind: kind, Data: b}
}

// runCLI runs rte-app with args against ta and returns the exit status and what it printed.
func (ta *testApp) runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env := []string{"APP_ADMIN_TOKEN=" + testAdminToken, "APP_URL=" + ta.URL}
	code := run(ctx, args, env, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}
