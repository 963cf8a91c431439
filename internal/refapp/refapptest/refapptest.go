// Package refapptest holds the test helpers the reference app's packages share: the app
// served on a real socket with a real SQLite store (StartApp), a fake outbound runner that
// answers connection checks, and the captured af_events streams. It is for tests only; no
// program imports it.
package refapptest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/internal/logging"
	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/server"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/jobs/afevents"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
	"github.com/rte-project/rte/protocol"
)

const (
	// AdminToken is the test app's APP_ADMIN_TOKEN.
	AdminToken = "admin-token-must-not-leak-5e1b9c0d"
	// RunnerToken is the hand-added runner's RTE_TOKEN.
	RunnerToken = "runner-token-must-not-leak-77aa31"
)

// SyncBuffer is testenv.Buffer, under the name these tests know.
type SyncBuffer = testenv.Buffer

// App is the reference app's server (server.Serve, as `rte-app serve` runs it) on a real
// socket with a real SQLite store, and one approved runner, "r1", that never answers: its
// jobs stay queued, and a test stores their records itself to play the runner.
type App struct {
	URL   string
	App   *app.App
	Store *sqlitestore.Store
	Logs  *SyncBuffer
}

// StartApp starts the test app; it stops at the end of the test, which fails if a token
// reached the app's log.
func StartApp(t *testing.T) *App {
	t.Helper()
	store, err := sqlitestore.Open(filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &SyncBuffer{}
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
	if err := a.AddRunner(context.Background(), &app.Runner{Name: "r1", URL: deadURL, Token: RunnerToken}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- server.Serve(ctx, a, ln, AdminToken, logger) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server.Serve returned %v, want nil after its context ended", err)
		}
		store.Close()
		for _, leak := range []string{AdminToken, RunnerToken} {
			if strings.Contains(logs.String(), leak) {
				t.Errorf("a token reached the log:\n%s", logs.String())
			}
		}
	})
	return &App{URL: "http://" + ln.Addr().String(), App: a, Store: store, Logs: logs}
}

// Call sends a request with the admin token and returns the status and body.
func (ta *App) Call(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	return ta.CallAs(t, method, path, body, "Bearer "+AdminToken)
}

// CallAs sends a request with the given Authorization header (none when empty).
func (ta *App) CallAs(t *testing.T, method, path, body, authorization string) (int, []byte) {
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

// Submit queues a job on r1 through the API and returns it.
func (ta *App) Submit(t *testing.T, body string) api.JobView {
	t.Helper()
	status, b := ta.Call(t, http.MethodPost, "/api/v2/jobs", body)
	if status != http.StatusCreated {
		t.Fatalf("POST /api/v2/jobs %s: got %d %s, want 201", body, status, b)
	}
	var j api.JobView
	if err := json.Unmarshal(b, &j); err != nil {
		t.Fatal(err)
	}
	return j
}

// StoreRecords plays the runner: it stores records for job as the app would on receiving them.
func (ta *App) StoreRecords(t *testing.T, job string, recs ...protocol.Record) {
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

// Record is a record of kind with data as its JSON.
func Record(t *testing.T, seq int64, kind string, data any) protocol.Record {
	t.Helper()
	b, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	return protocol.Record{Seq: seq, Kind: kind, Data: b}
}

// FakeOutbound is an approved outbound runner of the test app that answers every check:
// hosts starting with "up" connected, every other host unreachable.
type FakeOutbound struct {
	ws     *websocket.Conn
	done   chan struct{}
	mu     sync.Mutex
	checks []protocol.Check
}

// JoinFakeOutbound adds an approved outbound runner named name to ta and connects it.
func JoinFakeOutbound(t *testing.T, ta *App, name string) *FakeOutbound {
	t.Helper()
	const token = "outbound-token-0123456789abcdef"
	if err := ta.App.AddRunner(context.Background(), &app.Runner{Name: name, Mode: protocol.ModeOutbound, Token: token}); err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Authorization": {"Bearer " + token}, protocol.HeaderRTEName: {name}}
	d := websocket.Dialer{Subprotocols: []string{protocol.Subprotocol}, HandshakeTimeout: 10 * time.Second}
	ws, resp, err := d.Dial("ws"+strings.TrimPrefix(ta.URL, "http")+protocol.OutboundSocketPath, h)
	if err != nil {
		var answer []byte
		if resp != nil {
			answer, _ = io.ReadAll(resp.Body)
		}
		t.Fatalf("dial the app as runner %s: %v %s", name, err, answer)
	}
	resp.Body.Close()
	f := &FakeOutbound{ws: ws, done: make(chan struct{})}
	hello, _ := protocol.Encode(&protocol.Hello{Protocol: protocol.Version, Name: name, Version: "1.2.3", Instance: "test",
		Mode: protocol.ModeOutbound, Files: protocol.FilesLocal, MaxJobs: 1, Running: []string{}, Spooled: []protocol.SpooledJob{},
		TokenFingerprint: protocol.TokenFingerprint(token)})
	if err := ws.WriteMessage(websocket.TextMessage, hello); err != nil {
		t.Fatal(err)
	}
	go f.serve()
	t.Cleanup(func() {
		ws.Close()
		<-f.done
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, ok := ta.App.Status(name); ok && st.Connected {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("runner %s did not connect within 10s", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *FakeOutbound) serve() {
	defer close(f.done)
	for {
		_, data, err := f.ws.ReadMessage()
		if err != nil {
			return
		}
		m, err := protocol.Decode(data)
		c, ok := m.(*protocol.Check)
		if err != nil || !ok {
			continue // welcome, capacity questions: not this fake's business
		}
		f.mu.Lock()
		f.checks = append(f.checks, *c)
		f.mu.Unlock()
		res := protocol.CheckResult{ID: c.ID, Results: []protocol.CheckOutcome{}}
		for _, t := range c.Targets {
			o := protocol.CheckOutcome{Name: t.Name, Host: t.Host, Status: protocol.CheckUnreachable, Message: "connection refused", LatencyMS: 1}
			if strings.HasPrefix(t.Host, "up") {
				o.Status, o.Message = protocol.CheckConnected, ""
			}
			res.Results = append(res.Results, o)
		}
		b, _ := protocol.Encode(&res)
		if f.ws.WriteMessage(websocket.TextMessage, b) != nil {
			return
		}
	}
}

// LastCheck is the last check the runner got; the test fails if it got none.
func (f *FakeOutbound) LastCheck(t *testing.T) protocol.Check {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.checks) == 0 {
		t.Fatal("the runner got no check")
	}
	return f.checks[len(f.checks)-1]
}

// ReadEvents reads a stream the af_events plugin wrote, one event per line.
func ReadEvents(t *testing.T, path string) []json.RawMessage {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return SplitEvents(t, b)
}

// SplitEvents splits events written one per line, skipping blank lines.
func SplitEvents(t *testing.T, b []byte) []json.RawMessage {
	t.Helper()
	var out []json.RawMessage
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), afevents.MaxLineBytes)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			out = append(out, json.RawMessage(bytes.Clone(sc.Bytes())))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Runner is the runner named name as the app lists it; the test fails without one.
func (ta *App) Runner(t *testing.T, name string) *app.Runner {
	t.Helper()
	rs, err := ta.App.ListRunners(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no runner %q", name)
	return nil
}
