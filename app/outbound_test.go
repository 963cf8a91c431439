package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

const otherToken = "other-token-0123456789abcdef"

// outRTE is the RTE's side of an outbound socket, driven by the test.
type outRTE struct {
	t    *testing.T
	ws   *websocket.Conn
	name string
}

func outboundURL(ta *testApp) string {
	return "ws" + strings.TrimPrefix(ta.srv.URL, "http") + protocol.OutboundSocketPath
}

// dialOut dials the app's outbound endpoint as an RTE would; resp is the refusal, if any.
func dialOut(t *testing.T, ta *testApp, name, token, join string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	if name != "" {
		h.Set(protocol.HeaderRTEName, name)
	}
	if join != "" {
		h.Set(protocol.HeaderJoinToken, join)
	}
	d := websocket.Dialer{Subprotocols: []string{protocol.Subprotocol}, HandshakeTimeout: waitLimit}
	ws, resp, err := d.Dial(outboundURL(ta), h)
	if ws != nil {
		t.Cleanup(func() { _ = ws.Close() })
	}
	return ws, resp, err
}

// joinOut dials, sends the hello and returns the socket; the welcome is the next message.
func joinOut(t *testing.T, ta *testApp, name, token, join string) *outRTE {
	t.Helper()
	ws, resp, err := dialOut(t, ta, name, token, join)
	if err != nil {
		status, msg := refusal(t, resp)
		t.Fatalf("dial the app as %s: %v (%d %s)", name, err, status, msg)
	}
	o := &outRTE{t: t, ws: ws, name: name}
	o.sendRaw(outboundHello(t, name, token))
	return o
}

func outboundHello(t *testing.T, name, token string) string {
	t.Helper()
	b, err := protocol.Encode(&protocol.Hello{
		Protocol: protocol.Version, Name: name, Version: "1.2.3", Instance: "host1",
		Mode: protocol.ModeOutbound, Files: protocol.FilesLocal, MaxJobs: 2,
		Running: []string{}, Spooled: []protocol.SpooledJob{},
		TokenFingerprint: protocol.TokenFingerprint(token), AnsibleVersion: "2.14.18",
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (o *outRTE) sendRaw(text string) {
	o.t.Helper()
	if err := o.ws.WriteMessage(websocket.TextMessage, []byte(text)); err != nil {
		o.t.Fatalf("RTE write: %v", err)
	}
}

func (o *outRTE) send(m protocol.Message) {
	o.t.Helper()
	b, err := protocol.Encode(m)
	if err != nil {
		o.t.Fatal(err)
	}
	o.sendRaw(string(b))
}

func (o *outRTE) next() protocol.Message {
	o.t.Helper()
	_ = o.ws.SetReadDeadline(time.Now().Add(waitLimit))
	kind, data, err := o.ws.ReadMessage()
	if err != nil {
		o.t.Fatalf("RTE read: %v, want a message from the app", err)
	}
	if kind != websocket.TextMessage {
		o.t.Fatalf("the app sent a frame of kind %d, want text", kind)
	}
	return decodeFrame(o.t, data)
}

// want reads the next message and checks it is a T.
func want[T protocol.Message](o *outRTE) T {
	o.t.Helper()
	m := o.next()
	v, ok := m.(T)
	if !ok {
		var w T
		o.t.Fatalf("the app sent %T %+v, want %T", m, m, w)
	}
	return v
}

// closed reads until the app's close frame and returns it.
func (o *outRTE) closed() *websocket.CloseError {
	o.t.Helper()
	_ = o.ws.SetReadDeadline(time.Now().Add(waitLimit))
	for {
		if _, _, err := o.ws.ReadMessage(); err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) {
				o.t.Fatalf("RTE read: %v, want a close frame from the app", err)
			}
			return ce
		}
	}
}

// refusal reads a refused upgrade's status and JSON error.
func refusal(t *testing.T, resp *http.Response) (int, string) {
	t.Helper()
	if resp == nil {
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var ans struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(body, &ans); err != nil || ans.Error == "" {
		t.Fatalf("answer %d is not a JSON {\"error\"}: %q", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("answer %d has Content-Type %q, want application/json", resp.StatusCode, ct)
	}
	return resp.StatusCode, ans.Error
}

func (ta *testApp) waitLive(t *testing.T, name string, connected bool) {
	t.Helper()
	is := func() bool { st, ok := ta.Status(name); return ok && st.Connected }
	if !testenv.Poll(waitLimit, func() bool { return is() == connected }) {
		t.Fatalf("runner %s: connected=%v, want %v within %s", name, is(), connected, waitLimit)
	}
}

func runnerCount(t *testing.T, ta *testApp) int {
	t.Helper()
	rs, err := ta.store.ListRunners(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(rs)
}

// TestOutboundFirstJoinThenApprove is outbound mode's main path: an unknown RTE joins and waits
// on its open socket, an admin approves it, and a job runs over that same socket.
func TestOutboundFirstJoinThenApprove(t *testing.T) {
	ctx := context.Background()
	ta := newTestApp(t, nil)
	ta.start(t)
	o := joinOut(t, ta, "rte-out", testToken, "")
	if w := want[*protocol.Welcome](o); w.Approved || w.Node != testNode || w.Protocol != protocol.Version {
		t.Fatalf("welcome %+v, want approved false from %s", w, testNode)
	}
	r := ta.runner(t, "rte-out")
	if r.Mode != protocol.ModeOutbound || r.State != app.StateWaiting || r.TokenFingerprint != protocol.TokenFingerprint(testToken) ||
		r.RemoteAddr == "" || !r.RequestedAt.Equal(ta.clock.Now()) || r.Files != protocol.FilesLocal || r.URL != "" {
		t.Fatalf("runner after a first join: %+v, want a waiting outbound runner with its token fingerprint, address and time", r)
	}
	ta.waitLive(t, "rte-out", true)
	if _, err := ta.Submit(ctx, app.JobRequest{Runner: "rte-out", JobStart: protocol.JobStart{Playbook: "site.yml"}}); err == nil {
		t.Fatal("a job was queued for a runner nobody approved")
	}

	if err := ta.Approve(ctx, "rte-out"); err != nil {
		t.Fatal(err)
	}
	want[*protocol.Approved](o)
	j, err := ta.Submit(ctx, app.JobRequest{Runner: "rte-out", JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err != nil {
		t.Fatal(err)
	}
	if js := want[*protocol.JobStart](o); js.Job != j.ID {
		t.Fatalf("job.start for %q, want %q", js.Job, j.ID)
	}
	o.send(&protocol.JobAccepted{Job: j.ID})
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	start, _ := json.Marshal(protocol.StartData{PID: 7, Instance: "host1", Playbook: "site.yml"})
	end, _ := json.Marshal(protocol.EndData{Status: protocol.StatusSuccess})
	o.send(&protocol.Record{Job: j.ID, Seq: 1, Kind: protocol.KindStart, At: at, Data: start})
	o.send(&protocol.Record{Job: j.ID, Seq: 2, Kind: protocol.KindEnd, At: at, Data: end})
	for seq := int64(0); seq < 2; {
		ack := want[*protocol.Ack](o)
		if ack.Job != j.ID || ack.Seq < seq {
			t.Fatalf("ack %+v, want job %s moving up to 2", ack, j.ID)
		}
		seq = ack.Seq
	}
	if got := ta.waitJob(t, j.ID, "ended", inState(app.JobEnded)); got.Status != protocol.StatusSuccess {
		t.Fatalf("job %+v, want success", got)
	}
	if n := ta.logs.FilterMessageSnippet("outbound runner asks to join").Len(); n != 1 {
		t.Fatalf("%d log lines about the join request, want 1", n)
	}
}

// TestOutboundJoinToken: the app's join token approves a first join at once; the same RTE
// dialling again with it stays approved, and its newer socket replaces the older one.
func TestOutboundJoinToken(t *testing.T) {
	ta := newTestApp(t, nil)
	ta.start(t)
	first := joinOut(t, ta, "rte-join", testToken, testJoin)
	if w := want[*protocol.Welcome](first); !w.Approved {
		t.Fatalf("welcome %+v after a join with the app's join token, want approved", w)
	}
	if r := ta.runner(t, "rte-join"); r.State != app.StateApproved || r.ApprovedAt.IsZero() {
		t.Fatalf("runner %+v, want approved", r)
	}
	second := joinOut(t, ta, "rte-join", testToken, testJoin)
	// Reading the close answers it, as an RTE does; the newer socket is served once the older
	// one is gone.
	if ce := first.closed(); ce.Code != protocol.CloseReplaced {
		t.Fatalf("older socket closed with %d %q, want %d", ce.Code, ce.Text, protocol.CloseReplaced)
	}
	if w := want[*protocol.Welcome](second); !w.Approved {
		t.Fatalf("welcome %+v on the second socket, want approved", w)
	}

	// A waiting runner that comes back with the join token is approved by it.
	waiting := joinOut(t, ta, "rte-late", otherToken, "")
	want[*protocol.Welcome](waiting)
	again := joinOut(t, ta, "rte-late", otherToken, testJoin)
	waiting.closed()
	if w := want[*protocol.Welcome](again); !w.Approved {
		t.Fatalf("welcome %+v for a waiting runner that brought the join token, want approved", w)
	}
}

// TestOutboundRefusals: every refusal is an HTTP status with a JSON error before the upgrade,
// and none changes the runners.
func TestOutboundRefusals(t *testing.T) {
	ctx := context.Background()
	ta := newTestApp(t, func(c *app.Config) { c.MaxWaiting = 1 })
	ta.start(t)
	approved := joinOut(t, ta, "taken", testToken, testJoin)
	want[*protocol.Welcome](approved)
	if err := ta.AddRunner(ctx, &app.Runner{Name: "inbound1", URL: "https://127.0.0.1:1", Token: otherToken}); err != nil {
		t.Fatal(err)
	}
	waiting := joinOut(t, ta, "waiting", "waiting-token-0123456789", "")
	want[*protocol.Welcome](waiting)
	before := runnerCount(t, ta)

	for _, c := range []struct {
		name, token, join string
		status            int
		says              string
	}{
		{"taken", "wrong-token-0123456789abcdef", "", http.StatusUnauthorized, "not the one of runner"},
		{"someone-else", testToken, "", http.StatusUnauthorized, "belongs to another runner"},
		{"taken", "wrong-token-0123456789abcdef", testJoin, http.StatusForbidden, "does not take over"},
		{"newcomer", "new-token-0123456789abcdef", "wrong-join-0123456789abcdef", http.StatusForbidden, "not the app's join token"},
		{"inbound1", otherToken, "", http.StatusForbidden, "RTE_MODE=inbound"},
		{"newcomer", "new-token-0123456789abcdef", "", http.StatusTooManyRequests, "wait for an admin"},
		{"newcomer", "", "", http.StatusUnauthorized, "Authorization: Bearer"},
		{"newcomer", "short", "", http.StatusUnauthorized, "at least 16"},
		{"", "new-token-0123456789abcdef", "", http.StatusBadRequest, protocol.HeaderRTEName},
		{strings.Repeat("n", 200), "new-token-0123456789abcdef", "", http.StatusBadRequest, "at most 128"},
	} {
		_, resp, err := dialOut(t, ta, c.name, c.token, c.join)
		if err == nil {
			t.Errorf("%s/%q: the app took the socket, want %d", clipName(c.name), c.token, c.status)
			continue
		}
		status, msg := refusal(t, resp)
		if status != c.status || !strings.Contains(msg, c.says) {
			t.Errorf("%s/%q: %d %q, want %d saying %q", clipName(c.name), c.token, status, msg, c.status, c.says)
		}
		if status == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s/%q: 401 without WWW-Authenticate", clipName(c.name), c.token)
		}
	}
	if after := runnerCount(t, ta); after != before {
		t.Fatalf("%d runners after the refusals, want the %d there were", after, before)
	}
	if r := ta.runner(t, "taken"); r.State != app.StateApproved || r.TokenFingerprint != protocol.TokenFingerprint(testToken) {
		t.Fatalf("approved runner changed by refused sockets: %+v", r)
	}
	// The join token still joins when the waiting list is full: it needs no admin.
	joined := joinOut(t, ta, "joined", "joined-token-0123456789", testJoin)
	if w := want[*protocol.Welcome](joined); !w.Approved {
		t.Fatalf("welcome %+v, want approved", w)
	}
}

func clipName(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}

func TestOutboundJoinTokenRefusedWhenTheAppHasNone(t *testing.T) {
	ta := newTestApp(t, func(c *app.Config) { c.JoinToken = "" })
	_, resp, err := dialOut(t, ta, "rte01", testToken, testJoin)
	if err == nil {
		t.Fatal("the app took a join token it does not have")
	}
	if status, msg := refusal(t, resp); status != http.StatusForbidden || !strings.Contains(msg, "accepts no join token") {
		t.Fatalf("%d %q, want 403 saying the app accepts no join token", status, msg)
	}
}

// TestOutboundNotASocket: requests that are no WebSocket upgrade get a status and a JSON error.
func TestOutboundNotASocket(t *testing.T) {
	ta := newTestApp(t, nil)
	for _, c := range []struct {
		method string
		header map[string]string
		status int
		says   string
	}{
		{http.MethodGet, nil, http.StatusBadRequest, "WebSocket upgrade"},
		{http.MethodPost, nil, http.StatusMethodNotAllowed, "GET"},
		{http.MethodGet, map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
			"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Authorization": "Bearer " + testToken, protocol.HeaderRTEName: "rte01"},
			http.StatusBadRequest, protocol.Subprotocol},
		{http.MethodGet, map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "99",
			"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol": protocol.Subprotocol,
			"Authorization": "Bearer " + testToken, protocol.HeaderRTEName: "rte01"},
			http.StatusBadRequest, "websocket upgrade"},
	} {
		req, _ := http.NewRequest(c.method, ta.srv.URL+protocol.OutboundSocketPath, nil)
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		resp, err := ta.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		status, msg := refusal(t, resp)
		if status != c.status || !strings.Contains(msg, c.says) {
			t.Errorf("%s %v: %d %q, want %d saying %q", c.method, c.header, status, msg, c.status, c.says)
		}
	}
}

// TestOutboundReject: a waiting runner hears why it was rejected, its socket closes with 4003,
// and it is gone; its RTE may join again later, as a new request.
func TestOutboundReject(t *testing.T) {
	ta := newTestApp(t, nil)
	ta.start(t)
	o := joinOut(t, ta, "rte-out", testToken, "")
	want[*protocol.Welcome](o)
	ta.waitLive(t, "rte-out", true)
	if err := ta.Reject(context.Background(), "rte-out", "not one of ours"); err != nil {
		t.Fatal(err)
	}
	if r := want[*protocol.Rejected](o); r.Reason != "not one of ours" {
		t.Fatalf("rejected with %q, want the admin's reason", r.Reason)
	}
	if ce := o.closed(); ce.Code != protocol.CloseRejected || !strings.Contains(ce.Text, "not one of ours") {
		t.Fatalf("closed with %d %q, want %d with the reason", ce.Code, ce.Text, protocol.CloseRejected)
	}
	if _, err := ta.store.GetRunner(context.Background(), "rte-out"); !errors.Is(err, app.ErrNotFound) {
		t.Fatalf("rejected runner still stored: %v", err)
	}
	ta.waitLive(t, "rte-out", false)
	again := joinOut(t, ta, "rte-out", testToken, "")
	if w := want[*protocol.Welcome](again); w.Approved {
		t.Fatal("a rejected runner that joins again is approved, want waiting")
	}
}

// TestOutboundBadInput: after the upgrade, a bad hello closes the socket with a reason; once
// the runner is in, bad messages are answered and the socket stays.
func TestOutboundBadInput(t *testing.T) {
	ta := newTestApp(t, nil)
	ta.start(t)

	t.Run("garbage instead of hello", func(t *testing.T) {
		ws, _, err := dialOut(t, ta, "rte-a", testToken, testJoin)
		if err != nil {
			t.Fatal(err)
		}
		o := &outRTE{t: t, ws: ws}
		o.sendRaw("this is not JSON")
		if e := want[*protocol.Error](o); e.Code != protocol.ErrBadJSON {
			t.Fatalf("error %+v, want %s", e, protocol.ErrBadJSON)
		}
		if ce := o.closed(); ce.Code != protocol.CloseProtocolError {
			t.Fatalf("closed with %d, want %d", ce.Code, protocol.CloseProtocolError)
		}
	})

	t.Run("another protocol version", func(t *testing.T) {
		ws, _, err := dialOut(t, ta, "rte-a", testToken, "")
		if err != nil {
			t.Fatal(err)
		}
		o := &outRTE{t: t, ws: ws}
		o.sendRaw(strings.Replace(outboundHello(t, "rte-a", testToken), `"protocol":1`, `"protocol":2`, 1))
		if ce := o.closed(); ce.Code != protocol.CloseUnsupportedProtoV {
			t.Fatalf("closed with %d, want %d", ce.Code, protocol.CloseUnsupportedProtoV)
		}
	})

	t.Run("bad messages after the handshake", func(t *testing.T) {
		o := joinOut(t, ta, "rte-a", testToken, "")
		want[*protocol.Welcome](o)
		o.sendRaw(`{"type":"record","job":`)
		if e := want[*protocol.Error](o); e.Code != protocol.ErrBadJSON {
			t.Fatalf("error %+v, want %s", e, protocol.ErrBadJSON)
		}
		if err := o.ws.WriteMessage(websocket.BinaryMessage, []byte{1, 2, 3}); err != nil {
			t.Fatal(err)
		}
		if e := want[*protocol.Error](o); e.Code != protocol.ErrUnexpected {
			t.Fatalf("error %+v for a binary frame, want %s", e, protocol.ErrUnexpected)
		}
		o.send(&protocol.Welcome{Protocol: 1, Node: "x", Approved: true})
		if e := want[*protocol.Error](o); e.Code != protocol.ErrUnexpected {
			t.Fatalf("error %+v for a welcome from the RTE, want %s", e, protocol.ErrUnexpected)
		}
		big := `{"type":"capacity","running":0,"max_jobs":1,"draining":false,"pad":"` + strings.Repeat("x", protocol.MaxMessageBytes) + `"}`
		o.sendRaw(big)
		if e := want[*protocol.Error](o); e.Code != protocol.ErrTooLarge {
			t.Fatalf("error %+v for a frame over %d bytes, want %s", e, protocol.MaxMessageBytes, protocol.ErrTooLarge)
		}
		o.sendRaw(`{"type":"nonsense"}`)
		if e := want[*protocol.Error](o); e.Code != protocol.ErrUnknownType {
			t.Fatalf("error %+v, want %s: the socket must still be served", e, protocol.ErrUnknownType)
		}
	})
}

// TestOutboundWaitingRunnerIsNotDropped: a request on an open socket outlives WaitingTTL; once
// its socket is gone, it is dropped like any other.
func TestOutboundWaitingRunnerIsNotDropped(t *testing.T) {
	ctx := context.Background()
	ta := newTestApp(t, nil)
	ta.start(t)
	o := joinOut(t, ta, "rte-out", testToken, "")
	want[*protocol.Welcome](o)
	ta.waitLive(t, "rte-out", true)
	ta.clock.Advance(app.DefaultWaitingTTL + time.Hour)
	if rs, err := ta.ListRunners(ctx); err != nil || len(rs) != 1 {
		t.Fatalf("runners %v, %v: want the connected waiting runner kept", rs, err)
	}
	_ = o.ws.Close()
	ta.waitLive(t, "rte-out", false)
	if rs, err := ta.ListRunners(ctx); err != nil || len(rs) != 0 {
		t.Fatalf("runners %v, %v: want the request dropped once its socket is gone", rs, err)
	}
}

// TestOutboundEndsWithRun: Run's end closes outbound sockets, and later ones are refused.
func TestOutboundEndsWithRun(t *testing.T) {
	ta := newTestApp(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ta.Run(ctx) }()
	o := joinOut(t, ta, "rte-out", testToken, testJoin)
	want[*protocol.Welcome](o)
	cancel()
	if ce := o.closed(); ce.Code != websocket.CloseGoingAway {
		t.Fatalf("closed with %d %q, want %d", ce.Code, ce.Text, websocket.CloseGoingAway)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run did not return")
	}
	_, resp, err := dialOut(t, ta, "rte-out", testToken, "")
	if err == nil {
		t.Fatal("a socket was taken after Run returned")
	}
	if status, _ := refusal(t, resp); status != http.StatusServiceUnavailable {
		t.Fatalf("%d after Run returned, want 503", status)
	}
}

// FuzzOutboundAdmission throws arbitrary names, tokens and join tokens at the outbound
// endpoint, which anyone who reaches the app can call. Whatever comes, the answer is a status
// of the table with a JSON error, at most MaxWaiting runners wait, and only the app's join
// token approves anyone. (The upgrade itself is left incomplete, so every admission ends in a
// 400 from the upgrade after the runner was recorded.)
func FuzzOutboundAdmission(f *testing.F) {
	f.Add("rte01", testToken, "")
	f.Add("rte01", testToken, testJoin)
	f.Add("rte01", otherToken, testJoin)
	f.Add("rte02", testToken, "")
	f.Add("", "", "")
	f.Add("r\x00n", "0123456789abcdef\n", "x")
	f.Add(strings.Repeat("é", 100), strings.Repeat("t", 5000), testJoin+"x")

	const maxWaiting = 3
	store := app.NewMemoryStore()
	a, err := app.New(app.Config{Store: store, Node: testNode, JoinToken: testJoin, MaxWaiting: maxWaiting})
	if err != nil {
		f.Fatal(err)
	}
	h := a.Handler()
	allowed := map[int]bool{400: true, 401: true, 403: true, 429: true}
	var mu sync.Mutex
	joined := map[string]bool{} // names some request carried the app's join token for

	f.Fuzz(func(t *testing.T, name, token, join string) {
		mu.Lock()
		defer mu.Unlock()
		if join == testJoin {
			joined[name] = true
		}
		req := httptest.NewRequest(http.MethodGet, protocol.OutboundSocketPath, nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Protocol", protocol.Subprotocol)
		req.Header["Authorization"] = []string{"Bearer " + token}
		req.Header[protocol.HeaderRTEName] = []string{name}
		req.Header[protocol.HeaderJoinToken] = []string{join}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if !allowed[rec.Code] {
			t.Fatalf("name %q token %q join %q: status %d, not in the table", name, token, join, rec.Code)
		}
		var ans struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &ans); err != nil || ans.Error == "" {
			t.Fatalf("answer %d is not a JSON error: %q", rec.Code, rec.Body.Bytes())
		}
		runners, err := store.ListRunners(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		waiting := 0
		for _, r := range runners {
			if r.State == app.StateWaiting {
				waiting++
			}
			if r.State == app.StateApproved && !joined[r.Name] {
				t.Fatalf("runner %q is approved, but no request for it carried the join token", r.Name)
			}
		}
		if waiting > maxWaiting {
			t.Fatalf("%d runners wait, the bound is %d", waiting, maxWaiting)
		}
	})
}
