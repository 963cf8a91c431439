package session_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/session"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const waitLimit = 10 * time.Second // safety net for reads, not a measurement

var staticHello = protocol.Hello{
	Name: "rte01", Version: "1.2.3", Instance: "host-a", Mode: protocol.ModeInbound,
	Files: protocol.FilesTransfer, TokenFingerprint: "abcd-ef12", AnsibleVersion: "2.14.18",
	Images: []string{"rte:dev", "registry.example/ee-*:*"},
}

// rig is a Manager behind a WebSocket endpoint on 127.0.0.1:0, with Run running.
type rig struct {
	m   *session.Manager
	reg *prometheus.Registry
	url string
}

func newRig(t *testing.T, cfg session.Config) *rig {
	t.Helper()
	r := &rig{reg: prometheus.NewRegistry()}
	cfg.Logger = zaptest.NewLogger(t)
	cfg.Registry = r.reg
	if cfg.Hello.Name == "" {
		cfg.Hello = staticHello
	}
	if cfg.CapacityEvery == 0 {
		cfg.CapacityEvery = time.Hour // only the capacity tests want the periodic report
	}
	r.m = session.NewManager(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- r.m.Run(ctx) }()
	up := websocket.Upgrader{Subprotocols: []string{protocol.Subprotocol}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		ws, err := up.Upgrade(w, req, nil)
		if err != nil {
			t.Errorf("upgrade: %v", err)
			return
		}
		r.m.Accept(ws, req)
	}))
	r.url = "ws" + strings.TrimPrefix(srv.URL, "http")
	t.Cleanup(func() {
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
		srv.Close()
	})
	return r
}

// app is the test's side of a socket: a gorilla client acting as the app.
type app struct {
	t  *testing.T
	ws *websocket.Conn
}

func (r *rig) dial(t *testing.T) *app {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{protocol.Subprotocol}, HandshakeTimeout: waitLimit}
	ws, resp, err := d.Dial(r.url, http.Header{protocol.HeaderAppNode: {"app-1"}})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	_ = resp.Body.Close()
	t.Cleanup(func() { _ = ws.Close() })
	return &app{t: t, ws: ws}
}

// next reads the next message, skipping capacity reports unless skipCapacity is false.
func (a *app) next(skipCapacity bool) protocol.Message {
	a.t.Helper()
	for {
		_ = a.ws.SetReadDeadline(time.Now().Add(waitLimit))
		kind, data, err := a.ws.ReadMessage()
		if err != nil {
			a.t.Fatalf("app read: %v, want a message", err)
		}
		if kind != websocket.TextMessage {
			a.t.Fatalf("app read a frame of kind %d, want text", kind)
		}
		m, err := protocol.Decode(data)
		if err != nil {
			a.t.Fatalf("RTE sent %s, which does not decode: %v", data, err)
		}
		if _, ok := m.(*protocol.Capacity); ok && skipCapacity {
			continue
		}
		return m
	}
}

// expect reads the next message other than capacity and checks it is a T.
func expect[T protocol.Message](a *app) T {
	a.t.Helper()
	m := a.next(true)
	v, ok := m.(T)
	if !ok {
		var want T
		a.t.Fatalf("app got %T %+v, want %T", m, m, want)
	}
	return v
}

func (a *app) send(m protocol.Message) {
	a.t.Helper()
	b, err := protocol.Encode(m)
	if err != nil {
		a.t.Fatal(err)
	}
	a.sendRaw(string(b))
}

func (a *app) sendRaw(text string) {
	a.t.Helper()
	if err := a.ws.WriteMessage(websocket.TextMessage, []byte(text)); err != nil {
		a.t.Fatalf("app write: %v", err)
	}
}

// expectClose reads until the RTE's close frame and returns it; other frames are skipped.
func (a *app) expectClose() *websocket.CloseError {
	a.t.Helper()
	_ = a.ws.SetReadDeadline(time.Now().Add(waitLimit))
	for {
		if _, _, err := a.ws.ReadMessage(); err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) {
				a.t.Fatalf("app read: %v, want a close frame", err)
			}
			return ce
		}
	}
}

// handshake reads hello, answers with w and returns the hello.
func (a *app) handshake(w protocol.Welcome) *protocol.Hello {
	a.t.Helper()
	h := expect[*protocol.Hello](a)
	a.send(&w)
	return h
}

var approved = protocol.Welcome{Protocol: protocol.Version, Node: "app-1", Approved: true}

// metric reads one sample of a counter or gauge from reg; 0 when absent.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
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
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	return 0
}

// eventually polls cond until it holds; the limit is a safety net.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !testenv.Poll(waitLimit, cond) {
		t.Fatalf("still not %s after %s", what, waitLimit)
	}
}

func TestHelloFields(t *testing.T) {
	out := newOutbox()
	out.add("j1", "a")
	out.add("j1", "b")
	out.add("j2", "c")
	r := newRig(t, session.Config{Jobs: newJobs(7, "j1"), Outbox: out})
	a := r.dial(t)
	h := expect[*protocol.Hello](a)
	want := fmt.Sprintf("%+v", protocol.Hello{
		Protocol: protocol.Version, Name: "rte01", Version: "1.2.3", Instance: "host-a",
		Mode: protocol.ModeInbound, Files: protocol.FilesTransfer, MaxJobs: 7,
		Running: []string{"j1"}, Spooled: []protocol.SpooledJob{{Job: "j1", LastSeq: 2}, {Job: "j2", LastSeq: 1}},
		TokenFingerprint: "abcd-ef12", AnsibleVersion: "2.14.18", Images: []string{"rte:dev", "registry.example/ee-*:*"},
	})
	if got := fmt.Sprintf("%+v", *h); got != want {
		t.Fatalf("hello\n got %s\nwant %s", got, want)
	}
	if !r.m.Connected() {
		t.Fatal("Connected() = false with a socket open")
	}
	if _, ok := r.m.Welcomed(); ok {
		t.Fatal("Welcomed() ok before any welcome")
	}
}

// recordsOf reads n records and returns them as "job/seq".
func recordsOf(a *app, n int) []string {
	a.t.Helper()
	var got []string
	for range n {
		rec := expect[*protocol.Record](a)
		got = append(got, fmt.Sprintf("%s/%d", rec.Job, rec.Seq))
	}
	return got
}

func expectAck(t *testing.T, out *fakeOutbox, want protocol.Ack) {
	t.Helper()
	select {
	case got := <-out.acks:
		if got != want {
			t.Fatalf("Outbox.Ack(%s, %d), want (%s, %d)", got.Job, got.Seq, want.Job, want.Seq)
		}
	case <-time.After(waitLimit):
		t.Fatalf("Outbox.Ack(%s, %d) never came", want.Job, want.Seq)
	}
}

func TestWelcomeResendAckAndReconnect(t *testing.T) {
	out := newOutbox()
	for range 3 {
		out.add("j1", "x")
	}
	out.add("j2", "y")
	out.add("j2", "z")
	r := newRig(t, session.Config{Jobs: newJobs(7), Outbox: out})

	a := r.dial(t)
	w := approved
	w.Acked = map[string]int64{"j1": 1}
	a.handshake(w)
	expectAck(t, out, protocol.Ack{Job: "j1", Seq: 1})
	want := "[j1/2 j1/3 j2/1 j2/2]"
	if got := fmt.Sprint(recordsOf(a, 4)); got != want {
		t.Fatalf("resent after welcome: %s, want %s", got, want)
	}
	if approved, ok := r.m.Welcomed(); !approved || !ok {
		t.Fatalf("Welcomed() = %v, %v after an approving welcome, want true, true", approved, ok)
	}

	// A new record is sent as the spool signals it.
	out.add("j1", "late")
	if got := fmt.Sprint(recordsOf(a, 1)); got != "[j1/4]" {
		t.Fatalf("after an append: %s, want [j1/4]", got)
	}
	a.send(&protocol.Ack{Job: "j1", Seq: 4})
	expectAck(t, out, protocol.Ack{Job: "j1", Seq: 4})

	// The socket drops; the next one starts again from what was acked.
	_ = a.ws.Close()
	eventually(t, "disconnected", func() bool { return !r.m.Connected() })
	b := r.dial(t)
	h := b.handshake(approved)
	if fmt.Sprint(h.Spooled) != "[{j1 4} {j2 2}]" {
		t.Fatalf("hello.spooled on the second socket: %v, want [{j1 4} {j2 2}]", h.Spooled)
	}
	if got := fmt.Sprint(recordsOf(b, 2)); got != "[j2/1 j2/2]" {
		t.Fatalf("resent on the second socket: %s, want [j2/1 j2/2] (j1 is acked to 4)", got)
	}
	if got := metric(t, r.reg, "rte_records_sent_total", nil); got != 7 {
		t.Fatalf("rte_records_sent_total = %v, want 7 (4 + 1 + 2 resent)", got)
	}
	if got := metric(t, r.reg, "rte_acks_total", nil); got != 2 {
		t.Fatalf("rte_acks_total = %v, want 2", got)
	}
	if got := metric(t, r.reg, "rte_socket_connections_total", map[string]string{"direction": "inbound"}); got != 2 {
		t.Fatalf("rte_socket_connections_total{direction=inbound} = %v, want 2", got)
	}
}

func TestReplacement(t *testing.T) {
	r := newRig(t, session.Config{Jobs: newJobs(7)})
	first := r.dial(t)
	first.handshake(approved)
	second := r.dial(t)
	if ce := first.expectClose(); ce.Code != protocol.CloseReplaced || ce.Text != "replaced" {
		t.Fatalf("first socket closed with %d %q, want %d %q", ce.Code, ce.Text, protocol.CloseReplaced, "replaced")
	}
	second.handshake(approved)
	second.send(&protocol.JobStart{Job: "after-replace", Playbook: "site.yml"})
	if acc := expect[*protocol.JobAccepted](second); acc.Job != "after-replace" {
		t.Fatalf("job.accepted for %q, want after-replace", acc.Job)
	}
	if !r.m.Connected() {
		t.Fatal("Connected() = false with the newer socket open")
	}
	if got := metric(t, r.reg, "rte_socket_replaced_total", nil); got != 1 {
		t.Fatalf("rte_socket_replaced_total = %v, want 1", got)
	}
	if got := metric(t, r.reg, "rte_socket_connected", nil); got != 1 {
		t.Fatalf("rte_socket_connected = %v, want 1", got)
	}
}

func TestBadMessageAnsweredSocketKept(t *testing.T) {
	r := newRig(t, session.Config{Jobs: newJobs(7)})
	a := r.dial(t)
	a.handshake(approved)
	for _, tc := range []struct{ in, code, ref string }{
		{`nope`, protocol.ErrBadJSON, ""},
		{`{"type":"job.explode","job":"x1"}`, protocol.ErrUnknownType, "x1"},
		{`{"type":"ack","job":"x2"}`, protocol.ErrMissingField, "x2"},
		{`{"type":"job.cancel","job":"../etc"}`, protocol.ErrInvalid, "../etc"},
	} {
		a.sendRaw(tc.in)
		e := expect[*protocol.Error](a)
		if e.Code != tc.code || e.Ref != tc.ref {
			t.Fatalf("answer to %s: code %q ref %q, want code %q ref %q", tc.in, e.Code, e.Ref, tc.code, tc.ref)
		}
	}
	a.send(&protocol.JobStart{Job: "still-open", Playbook: "site.yml"})
	if acc := expect[*protocol.JobAccepted](a); acc.Job != "still-open" {
		t.Fatalf("job.accepted for %q, want still-open", acc.Job)
	}
	if got := metric(t, r.reg, "rte_bad_messages_total", map[string]string{"code": protocol.ErrBadJSON}); got != 1 {
		t.Fatalf("rte_bad_messages_total{code=bad_json} = %v, want 1", got)
	}
}

func TestUnexpectedMessages(t *testing.T) {
	r := newRig(t, session.Config{Jobs: newJobs(7)})
	a := r.dial(t)
	a.handshake(approved)
	for _, tc := range []struct {
		name string
		m    protocol.Message
		ref  string
		says string
	}{
		{"check", &protocol.Check{ID: "c1", Targets: []protocol.CheckTarget{{Host: "h", Transport: "ssh"}}}, "c1", "does not handle"},
		{"bundle.end", &protocol.BundleEnd{Hash: "sha256:" + strings.Repeat("a", 64)}, "sha256:" + strings.Repeat("a", 64), "receives no bundles"},
		{"hello", &staticHello, "", "only the RTE sends"},
		{"record", &protocol.Record{Job: "j1", Seq: 1, Kind: "log", Data: []byte(`{}`)}, "j1", "only the RTE sends"},
		{"second welcome", &approved, "", "welcomed already"},
		{"ack without spool", &protocol.Ack{Job: "j1", Seq: 1}, "j1", "no spool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.t = t
			if h, ok := tc.m.(*protocol.Hello); ok {
				hh := *h
				hh.Protocol = 1
				tc.m = &hh
			}
			a.send(tc.m)
			e := expect[*protocol.Error](a)
			if e.Code != protocol.ErrUnexpected || e.Ref != tc.ref || !strings.Contains(e.Message, tc.says) {
				t.Fatalf("answer to %s: %+v, want code %q ref %q saying %q", tc.name, *e, protocol.ErrUnexpected, tc.ref, tc.says)
			}
		})
	}
	a.t = t
	if err := a.ws.WriteMessage(websocket.BinaryMessage, []byte{protocol.ChunkTag, 1, 2}); err != nil {
		t.Fatal(err)
	}
	if e := expect[*protocol.Error](a); e.Code != protocol.ErrUnexpected || !strings.Contains(e.Message, "binary") {
		t.Fatalf("answer to a binary frame: %+v, want unexpected about binary frames", *e)
	}
}

func TestWelcomeWithUnknownProtocolCloses4400(t *testing.T) {
	r := newRig(t, session.Config{})
	a := r.dial(t)
	w := approved
	w.Protocol = 99
	a.handshake(w)
	if ce := a.expectClose(); ce.Code != protocol.CloseUnsupportedProtoV || !strings.Contains(ce.Text, "99") {
		t.Fatalf("closed with %d %q, want %d naming protocol 99", ce.Code, ce.Text, protocol.CloseUnsupportedProtoV)
	}
}

func TestNoWelcomeCloses(t *testing.T) {
	r := newRig(t, session.Config{HelloTimeout: 100 * time.Millisecond})
	a := r.dial(t)
	expect[*protocol.Hello](a)
	if ce := a.expectClose(); ce.Code != protocol.CloseProtocolError || !strings.Contains(ce.Text, "welcome") {
		t.Fatalf("closed with %d %q, want %d saying no welcome came", ce.Code, ce.Text, protocol.CloseProtocolError)
	}
}

func TestApproval(t *testing.T) {
	jobs := newJobs(7)
	r := newRig(t, session.Config{Jobs: jobs})
	a := r.dial(t)

	expect[*protocol.Hello](a)
	a.send(&protocol.JobStart{Job: "early", Playbook: "site.yml"})
	if ref := expect[*protocol.JobRefused](a); ref.Code != protocol.RefusedNotApproved || !strings.Contains(ref.Message, "welcome") {
		t.Fatalf("job.start before welcome: %+v, want refused not_approved naming the welcome", *ref)
	}

	w := approved
	w.Approved = false
	a.send(&w)
	a.send(&protocol.JobStart{Job: "j1", Playbook: "site.yml"})
	if ref := expect[*protocol.JobRefused](a); ref.Job != "j1" || ref.Code != protocol.RefusedNotApproved {
		t.Fatalf("job.start while not approved: %+v, want refused not_approved", *ref)
	}
	if approved, ok := r.m.Welcomed(); approved || !ok {
		t.Fatalf("Welcomed() = %v, %v after approved:false, want false, true", approved, ok)
	}

	a.send(&protocol.Approved{})
	a.send(&protocol.JobStart{Job: "j2", Playbook: "site.yml"})
	if acc := expect[*protocol.JobAccepted](a); acc.Job != "j2" {
		t.Fatalf("job.accepted for %q after approved, want j2", acc.Job)
	}
	if approved, ok := r.m.Welcomed(); !approved || !ok {
		t.Fatalf("Welcomed() = %v, %v after approved, want true, true", approved, ok)
	}

	a.send(&protocol.Rejected{Reason: "not this one"})
	a.send(&protocol.JobStart{Job: "j3", Playbook: "site.yml"})
	if ref := expect[*protocol.JobRefused](a); ref.Job != "j3" || ref.Code != protocol.RefusedNotApproved {
		t.Fatalf("job.start after rejected: %+v, want refused not_approved", *ref)
	}
	jobs.mu.Lock()
	defer jobs.mu.Unlock()
	if fmt.Sprint(jobs.started) != "[j2]" {
		t.Fatalf("Jobs.Start got %v, want only [j2]", jobs.started)
	}
}

func TestJobStartOutcomes(t *testing.T) {
	jobs := newJobs(7)
	r := newRig(t, session.Config{Jobs: jobs})
	a := r.dial(t)
	a.handshake(approved)
	for i, tc := range []struct {
		name     string
		err      error
		code     string // "" : accepted
		contains string
	}{
		{"accepted", nil, "", ""},
		{"full", refusal{protocol.RefusedFull, "10 of 10 jobs running"}, protocol.RefusedFull, "10 of 10"},
		{"wrapped draining", fmt.Errorf("start: %w", refusal{protocol.RefusedDraining, "draining"}), protocol.RefusedDraining, "start: draining"},
		{"files too large", refusal{protocol.RefusedFilesTooLarge, "mount it"}, protocol.RefusedFilesTooLarge, "mount it"},
		{"unknown code", refusal{"bogus", "odd"}, protocol.RefusedInvalid, "odd"},
		{"plain error", errors.New("playbook site.yml not found"), protocol.RefusedInvalid, "site.yml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.t = t
			jobs.setStartErr(tc.err)
			job := fmt.Sprintf("job-%d", i)
			a.send(&protocol.JobStart{Job: job, Playbook: "site.yml"})
			switch m := a.next(true).(type) {
			case *protocol.JobAccepted:
				if tc.code != "" || m.Job != job {
					t.Fatalf("got job.accepted for %s, want refused %q for %s", m.Job, tc.code, job)
				}
			case *protocol.JobRefused:
				if m.Job != job || m.Code != tc.code || !strings.Contains(m.Message, tc.contains) {
					t.Fatalf("got %+v, want refused %q for %s with a message containing %q", *m, tc.code, job, tc.contains)
				}
			default:
				t.Fatalf("got %T, want job.accepted or job.refused", m)
			}
		})
	}
}

func TestNoJobsRefusesInvalid(t *testing.T) {
	r := newRig(t, session.Config{})
	a := r.dial(t)
	a.handshake(approved)
	a.send(&protocol.JobStart{Job: "j1", Playbook: "site.yml"})
	if ref := expect[*protocol.JobRefused](a); ref.Code != protocol.RefusedInvalid || !strings.Contains(ref.Message, "runs no jobs") {
		t.Fatalf("job.start with no Jobs: %+v, want refused invalid saying the RTE runs no jobs", *ref)
	}
}

func TestMaxJobsCancelAndCapacity(t *testing.T) {
	jobs := newJobs(7)
	r := newRig(t, session.Config{Jobs: jobs})
	a := r.dial(t)
	w := approved
	w.MaxJobs = 5
	a.handshake(w)
	expectMax := func(step string, want int) {
		t.Helper()
		select {
		case got := <-jobs.maxSet:
			if got != want {
				t.Fatalf("%s: SetMaxJobs(%d), want %d", step, got, want)
			}
		case <-time.After(waitLimit):
			t.Fatalf("%s: SetMaxJobs(%d) never came", step, want)
		}
	}
	expectMax("welcome max_jobs 5", 5)
	if c, ok := a.next(false).(*protocol.Capacity); !ok || c.MaxJobs != 5 || c.Running != 0 {
		t.Fatalf("first message after welcome: %+v, want capacity running 0 max_jobs 5", c)
	}

	jobs.setRunning("j1", "j2")
	if c, ok := a.next(false).(*protocol.Capacity); !ok || c.Running != 2 {
		t.Fatalf("after Jobs.Changed: %+v, want capacity running 2", c)
	}

	a.send(&protocol.Settings{MaxJobs: 3})
	expectMax("settings max_jobs 3", 3)
	a.send(&protocol.Settings{MaxJobs: 0})
	expectMax("settings max_jobs 0 (use RTE_MAX_JOBS)", 7)

	a.send(&protocol.JobCancel{Job: "known"})
	select {
	case got := <-jobs.canceled:
		if got != "known" {
			t.Fatalf("Jobs.Cancel(%q), want known", got)
		}
	case <-time.After(waitLimit):
		t.Fatal("Jobs.Cancel never came")
	}
}

func TestCapacityEvery(t *testing.T) {
	r := newRig(t, session.Config{Jobs: newJobs(4), CapacityEvery: 20 * time.Millisecond})
	a := r.dial(t)
	a.handshake(approved)
	for i := range 3 {
		if c, ok := a.next(false).(*protocol.Capacity); !ok || c.MaxJobs != 4 {
			t.Fatalf("message %d after welcome: %+v, want a capacity report with max_jobs 4", i+1, c)
		}
	}
}

func TestKeepaliveDeath(t *testing.T) {
	r := newRig(t, session.Config{PingInterval: 50 * time.Millisecond, DeadAfter: 150 * time.Millisecond})
	a := r.dial(t)
	a.handshake(approved)
	eventually(t, "welcomed", func() bool { _, ok := r.m.Welcomed(); return ok })
	// From here the app reads nothing, so it answers no ping: the session must notice.
	eventually(t, "disconnected after the peer went silent", func() bool { return !r.m.Connected() })
	// The gauge drops when the session has finished closing, a moment after Connected.
	eventually(t, "rte_socket_connected back to 0", func() bool {
		return metric(t, r.reg, "rte_socket_connected", nil) == 0
	})
}

func TestRunShutdownClosesGoingAway(t *testing.T) {
	m := session.NewManager(session.Config{Logger: zaptest.NewLogger(t), Hello: staticHello})
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- m.Run(ctx) }()
	up := websocket.Upgrader{Subprotocols: []string{protocol.Subprotocol}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if ws, err := up.Upgrade(w, req, nil); err == nil {
			m.Accept(ws, req)
		}
	}))
	defer srv.Close()
	r := &rig{m: m, url: "ws" + strings.TrimPrefix(srv.URL, "http")}
	a := r.dial(t)
	a.handshake(approved)
	cancel()
	if ce := a.expectClose(); ce.Code != websocket.CloseGoingAway {
		t.Fatalf("closed with %d %q at shutdown, want %d", ce.Code, ce.Text, websocket.CloseGoingAway)
	}
	select {
	case err := <-runDone:
		if err != nil {
			t.Fatalf("Run: %v, want nil after shutdown", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run did not return after its context ended")
	}
	if m.Connected() {
		t.Fatal("Connected() = true after Run returned")
	}
	// A socket arriving after Run stopped is turned away.
	late := r.dial(t)
	if ce := late.expectClose(); ce.Code != websocket.CloseGoingAway {
		t.Fatalf("socket after shutdown closed with %d %q, want %d", ce.Code, ce.Text, websocket.CloseGoingAway)
	}
	if err := m.Run(context.Background()); err == nil {
		t.Fatal("second Run returned nil, want an error")
	}
}

// appServer is an app endpoint for outbound tests: each upgraded socket goes to the channel.
func appServer(t *testing.T, subprotocols []string) (string, <-chan *websocket.Conn) {
	t.Helper()
	got := make(chan *websocket.Conn, 1)
	up := websocket.Upgrader{Subprotocols: subprotocols}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if ws, err := up.Upgrade(w, req, nil); err == nil {
			got <- ws
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http") + protocol.OutboundSocketPath, got
}

func dialApp(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{protocol.Subprotocol}, HandshakeTimeout: waitLimit}
	ws, resp, err := d.Dial(url, nil)
	if err != nil {
		t.Fatalf("dial the app: %v", err)
	}
	_ = resp.Body.Close()
	return ws
}

func TestServeOutbound(t *testing.T) {
	hello := staticHello
	hello.Mode = protocol.ModeOutbound
	reg := prometheus.NewRegistry()
	m := session.NewManager(session.Config{Logger: zaptest.NewLogger(t), Registry: reg, Hello: hello, Jobs: newJobs(2)})
	url, accepted := appServer(t, []string{protocol.Subprotocol})
	rteSide := dialApp(t, url)
	served := make(chan error, 1)
	go func() { served <- m.Serve(context.Background(), rteSide) }()

	appSide := <-accepted
	defer appSide.Close()
	a := &app{t: t, ws: appSide}
	w := approved
	w.Approved = false
	if h := a.handshake(w); h.Mode != protocol.ModeOutbound {
		t.Fatalf("hello.mode %q, want outbound", h.Mode)
	}
	a.send(&protocol.Approved{})
	a.send(&protocol.JobStart{Job: "j1", Playbook: "site.yml"})
	expect[*protocol.JobAccepted](a)
	// The app closes; Serve returns why.
	_ = appSide.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(protocol.CloseRejected, "rejected"), time.Now().Add(time.Second))
	select {
	case err := <-served:
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != protocol.CloseRejected {
			t.Fatalf("Serve returned %v, want the app's close %d", err, protocol.CloseRejected)
		}
	case <-time.After(waitLimit):
		t.Fatal("Serve did not return after the app closed")
	}
	if got := metric(t, reg, "rte_socket_connections_total", map[string]string{"direction": "outbound"}); got != 1 {
		t.Fatalf("rte_socket_connections_total{direction=outbound} = %v, want 1", got)
	}
}

func TestServeWithoutSubprotocolCloses1002(t *testing.T) {
	m := session.NewManager(session.Config{Logger: zaptest.NewLogger(t), Hello: staticHello})
	url, accepted := appServer(t, nil) // this app does not echo rte.v1
	rteSide := dialApp(t, url)
	appSide := <-accepted
	defer appSide.Close()
	if err := m.Serve(context.Background(), rteSide); err == nil || !strings.Contains(err.Error(), protocol.Subprotocol) {
		t.Fatalf("Serve on a socket without rte.v1: %v, want an error naming %s", err, protocol.Subprotocol)
	}
	a := &app{t: t, ws: appSide}
	if ce := a.expectClose(); ce.Code != protocol.CloseProtocolError {
		t.Fatalf("closed with %d %q, want %d", ce.Code, ce.Text, protocol.CloseProtocolError)
	}
}

// TestServeEndsWithContext checks Serve returns nil when its context ends the socket.
func TestServeEndsWithContext(t *testing.T) {
	m := session.NewManager(session.Config{Logger: zaptest.NewLogger(t), Hello: staticHello})
	url, accepted := appServer(t, []string{protocol.Subprotocol})
	rteSide := dialApp(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- m.Serve(ctx, rteSide) }()
	appSide := <-accepted
	defer appSide.Close()
	a := &app{t: t, ws: appSide}
	a.handshake(approved)
	eventually(t, "welcomed", func() bool { _, ok := m.Welcomed(); return ok })
	cancel()
	if ce := a.expectClose(); ce.Code != websocket.CloseGoingAway {
		t.Fatalf("closed with %d %q, want %d", ce.Code, ce.Text, websocket.CloseGoingAway)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve after its context ended: %v, want nil", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Serve did not return after its context ended")
	}
}
