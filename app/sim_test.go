package app_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// waitLimit is the safety net of every wait in these tests, not a measurement.
const waitLimit = 15 * time.Second

// simRTE is the RTE side of an inbound socket that behaves like an RTE, over real TLS: it
// keeps a spool per job, says what it holds in its hello, resends what the welcome does not
// ack, answers job.start (accepting a job it already has again, never starting it twice), and
// records every ack. Records are made by the test with emit.
type simRTE struct {
	t       testing.TB
	cert    testCert
	name    string
	token   string
	maxJobs int

	ln  net.Listener
	srv *http.Server
	wg  sync.WaitGroup

	// refuse, when set, decides a new job's fate: a refusal code, or "" to accept it.
	refuse func(start protocol.JobStart) string
	// checkAck, when set, is called for every ack as it arrives; an error it returns is kept
	// as a violation.
	checkAck func(protocol.Ack) error

	wmu sync.Mutex // one writer on the socket; held across a spool append and its send, so sends keep seq order

	mu         sync.Mutex
	ws         *websocket.Conn // the current socket, nil while disconnected
	conns      []*websocket.Conn
	jobs       map[string]*simJob
	offers     map[string]int // job.start messages received per job
	welcomes   []protocol.Welcome
	acks       []protocol.Ack
	violations []string
	resent     int // records sent because a welcome did not ack them

	starts   chan protocol.JobStart // new jobs accepted
	cancels  chan string
	errs     chan protocol.Error
	sockets  chan struct{} // one per welcome
	refusals chan string
	settings chan protocol.Settings
}

type simJob struct {
	start   protocol.JobStart
	secrets map[string]string // opened with the token
	spool   []protocol.Record // seq = index + 1
	acked   int64
	ended   bool
}

func startSim(t testing.TB, name string, maxJobs int) *simRTE {
	t.Helper()
	s := &simRTE{
		t: t, cert: newCert(t), name: name, token: testToken, maxJobs: maxJobs,
		jobs: map[string]*simJob{}, offers: map[string]int{},
		starts: make(chan protocol.JobStart, 64), cancels: make(chan string, 64), errs: make(chan protocol.Error, 64),
		sockets: make(chan struct{}, 64), refusals: make(chan string, 64), settings: make(chan protocol.Settings, 8),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{s.cert.tls}, MinVersion: tls.VersionTLS12})
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(s.ln)
	}()
	t.Cleanup(s.Close)
	return s
}

func (s *simRTE) url() string { return "https://" + s.ln.Addr().String() }

// Close stops the listener and every socket, and waits for all of the sim's goroutines.
func (s *simRTE) Close() {
	_ = s.srv.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *simRTE) serve(w http.ResponseWriter, r *http.Request) {
	s.wg.Add(1)
	defer s.wg.Done()
	if r.URL.Path != protocol.SocketPath || r.Header.Get("Authorization") != "Bearer "+s.token || r.Header.Get(protocol.HeaderAppNode) == "" {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	up := websocket.Upgrader{Subprotocols: []string{protocol.Subprotocol}}
	ws, err := up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer ws.Close()
	s.mu.Lock()
	s.conns = append(s.conns, ws)
	s.mu.Unlock()
	if err := s.handshake(ws); err != nil {
		return
	}
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			s.mu.Lock()
			if s.ws == ws {
				s.ws = nil
			}
			s.mu.Unlock()
			return
		}
		m, err := protocol.Decode(data)
		if err != nil {
			s.violation("the app sent a frame that does not decode: %v: %.200s", err, data)
			continue
		}
		s.receive(ws, m)
	}
}

// handshake sends the hello, reads the welcome and resends every spooled record it does not
// ack, in order, before anything else is sent on the socket.
func (s *simRTE) handshake(ws *websocket.Conn) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	hello := protocol.Hello{Protocol: protocol.Version, Name: s.name, Version: "1.2.3", Instance: "sim", Mode: protocol.ModeInbound,
		Files: protocol.FilesLocal, MaxJobs: s.maxJobs, Running: []string{}, Spooled: []protocol.SpooledJob{},
		TokenFingerprint: protocol.TokenFingerprint(s.token), AnsibleVersion: "2.14.18"}
	for id, j := range s.jobs {
		if !j.ended {
			hello.Running = append(hello.Running, id)
		}
		if len(j.spool) > 0 && !(j.ended && j.acked == int64(len(j.spool))) {
			hello.Spooled = append(hello.Spooled, protocol.SpooledJob{Job: id, LastSeq: int64(len(j.spool))})
		}
	}
	s.mu.Unlock()
	if err := s.write(ws, hello); err != nil {
		return err
	}
	_, data, err := ws.ReadMessage()
	if err != nil {
		return err
	}
	m, err := protocol.Decode(data)
	welcome, ok := m.(*protocol.Welcome)
	if err != nil || !ok {
		s.violation("first frame from the app is %.200s (%v), want welcome", data, err)
		return errors.New("no welcome")
	}
	s.mu.Lock()
	s.welcomes = append(s.welcomes, *welcome)
	var resend []protocol.Record
	for _, sp := range hello.Spooled {
		j := s.jobs[sp.Job]
		from := welcome.Acked[sp.Job]
		if from > j.acked {
			j.acked = from
		}
		resend = append(resend, j.spool[from:]...)
	}
	s.resent += len(resend)
	s.ws = ws
	s.mu.Unlock()
	for _, r := range resend {
		if err := s.write(ws, r); err != nil {
			return err
		}
	}
	select {
	case s.sockets <- struct{}{}:
	default:
	}
	return nil
}

func (s *simRTE) write(ws *websocket.Conn, m protocol.Message) error {
	b, err := protocol.Encode(m)
	if err != nil {
		s.t.Errorf("sim encode %s: %v", m.Type(), err)
		return err
	}
	return ws.WriteMessage(websocket.TextMessage, b)
}

// reply writes m on ws, unless the socket was replaced.
func (s *simRTE) reply(ws *websocket.Conn, m protocol.Message) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_ = s.write(ws, m)
}

func (s *simRTE) receive(ws *websocket.Conn, m protocol.Message) {
	switch m := m.(type) {
	case *protocol.JobStart:
		s.mu.Lock()
		s.offers[m.Job]++
		_, have := s.jobs[m.Job]
		s.mu.Unlock()
		if have {
			s.reply(ws, protocol.JobAccepted{Job: m.Job})
			return
		}
		if s.refuse != nil {
			if code := s.refuse(*m); code != "" {
				s.reply(ws, protocol.JobRefused{Job: m.Job, Code: code, Message: "the sim refuses: " + code})
				s.refusals <- m.Job
				return
			}
		}
		j := &simJob{start: *m, secrets: map[string]string{}}
		for name, sealed := range m.Secrets {
			plain, err := protocol.OpenSecret(s.token, m.Job, sealed)
			if err != nil {
				s.violation("secret %s of job %s does not open with the runner's token: %v", name, m.Job, err)
			}
			j.secrets[name] = plain
		}
		s.mu.Lock()
		s.jobs[m.Job] = j
		s.mu.Unlock()
		s.reply(ws, protocol.JobAccepted{Job: m.Job})
		s.starts <- *m
	case *protocol.JobCancel:
		s.cancels <- m.Job
	case *protocol.Ack:
		var err error
		if s.checkAck != nil {
			err = s.checkAck(*m)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			s.violations = append(s.violations, err.Error())
		}
		j := s.jobs[m.Job]
		switch {
		case j == nil:
			s.violations = append(s.violations, fmt.Sprintf("ack for job %s, which the sim never had", m.Job))
		case m.Seq > int64(len(j.spool)):
			s.violations = append(s.violations, fmt.Sprintf("ack %d for job %s, beyond the %d records sent", m.Seq, m.Job, len(j.spool)))
		case m.Seq > j.acked:
			j.acked = m.Seq
		}
		s.acks = append(s.acks, *m)
	case *protocol.Error:
		s.errs <- *m
	case *protocol.Settings:
		s.settings <- *m
	}
}

func (s *simRTE) violation(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
}

// emit appends a record to the job's spool and sends it when a socket is up, as the RTE does
// once the record is durable in its spool.
func (s *simRTE) emit(job, kind string, data any) protocol.Record {
	s.t.Helper()
	raw, err := json.Marshal(data)
	if err != nil {
		s.t.Fatal(err)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	j := s.jobs[job]
	if j == nil {
		j = &simJob{}
		s.jobs[job] = j
	}
	r := protocol.Record{Job: job, Seq: int64(len(j.spool)) + 1, Kind: kind, At: time.Now().UTC(), Data: raw}
	j.spool = append(j.spool, r)
	if kind == protocol.KindEnd {
		j.ended = true
	}
	ws := s.ws
	s.mu.Unlock()
	if ws != nil {
		_ = s.write(ws, r)
	}
	return r
}

// send writes any message on the current socket.
func (s *simRTE) send(m protocol.Message) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	ws := s.ws
	s.mu.Unlock()
	if ws == nil {
		s.t.Fatalf("sim has no socket to send %s on", m.Type())
	}
	_ = s.write(ws, m)
}

// drop cuts the TCP connection under the current socket, with no close frame: what a network
// failure looks like. Records in flight may or may not have reached the app.
func (s *simRTE) drop() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ws != nil {
		_ = s.ws.UnderlyingConn().Close()
		s.ws = nil
	}
}

func (s *simRTE) acked(job string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if j := s.jobs[job]; j != nil {
		return j.acked
	}
	return 0
}

func (s *simRTE) offersOf(job string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.offers[job]
}

// noViolations fails the test with everything the sim saw go wrong.
func (s *simRTE) noViolations(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.violations {
		t.Error(v)
	}
}

// acksOf returns the acks received for job, in order.
func (s *simRTE) acksOf(job string) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, a := range s.acks {
		if a.Job == job {
			out = append(out, a.Seq)
		}
	}
	return out
}

func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLimit):
		t.Fatalf("no %s within %s", what, waitLimit)
		var zero T
		return zero
	}
}

// runningApp is a testApp whose Run is going, on the given store, with fast timing knobs.
func runningApp(t *testing.T, store app.Store, edit func(*app.Config)) *testApp {
	t.Helper()
	ta := newTestApp(t, func(c *app.Config) {
		c.Store = store
		c.PollInterval = 20 * time.Millisecond
		c.RedialMin = 20 * time.Millisecond
		c.RedialMax = 100 * time.Millisecond
		if edit != nil {
			edit(c)
		}
	})
	ta.store = store
	return ta
}

// start runs the App until the test ends.
func (ta *testApp) start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ta.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v, want nil after cancel", err)
		}
	})
}

// addSim adds the sim as an approved runner pinned to its certificate.
func (ta *testApp) addSim(t *testing.T, s *simRTE) {
	t.Helper()
	if err := ta.AddRunner(context.Background(), &app.Runner{Name: s.name, URL: s.url(), Token: s.token, Certificate: s.cert.der}); err != nil {
		t.Fatal(err)
	}
}

// waitConnected waits until the App holds a socket to the runner.
func (ta *testApp) waitConnected(t *testing.T, s *simRTE) {
	t.Helper()
	recv(t, s.sockets, "socket from the app to "+s.name)
	// The sim's side of the handshake ends a moment before the App starts serving the socket.
	deadline := time.Now().Add(waitLimit)
	for {
		if st, ok := ta.Status(s.name); ok && st.Connected {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the app did not report %s connected within %s", s.name, waitLimit)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitJob waits, through Watch alone, until cond holds for the job, and returns it.
func (ta *testApp) waitJob(t *testing.T, id string, what string, cond func(*app.Job) bool) *app.Job {
	t.Helper()
	ch, stop := ta.Watch(id)
	defer stop()
	deadline := time.After(waitLimit)
	for {
		j, err := ta.GetJob(context.Background(), id)
		if err != nil {
			t.Fatalf("get job %s: %v", id, err)
		}
		if cond(j) {
			return j
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("job %s: want %s within %s; it is %s (status %q, message %q)", id, what, waitLimit, j.State, j.Status, j.Message)
		}
	}
}

func inState(s app.JobState) func(*app.Job) bool {
	return func(j *app.Job) bool { return j.State == s }
}

func output(text string) protocol.OutputData { return protocol.OutputData{Text: text} }

// wantRecords checks that the store holds exactly want, in order, each once.
func wantRecords(t *testing.T, ta *testApp, job string, want []protocol.Record) {
	t.Helper()
	got, err := ta.Records(context.Background(), job, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("job %s has %d records stored, want %d", job, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Seq != w.Seq || g.Kind != w.Kind || !g.At.Equal(w.At) || string(g.Data) != string(w.Data) {
			t.Fatalf("record %d of job %s is seq %d %s %s, want seq %d %s %s", i, job, g.Seq, g.Kind, g.Data, w.Seq, w.Kind, w.Data)
		}
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
