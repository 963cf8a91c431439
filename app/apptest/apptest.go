package apptest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/protocol"
)

// queue is the depth of each channel a test reads (Starts, Cancels, ...). A test that stops
// reading one must not block the fake: past this depth Frames drops, the others block the
// socket's reader until the test reads or the fake closes.
const queue = 64

// Config says how the fake RTE behaves. Token is required; the rest has defaults.
type Config struct {
	// Name is the RTE_NAME the hello carries; "rte01" when empty.
	Name string
	// Token is the runner's RTE_TOKEN: the bearer token the app must send, and the key that
	// opens the job's sealed secrets.
	Token string
	// MaxJobs is the hello's max_jobs; 10 when zero.
	MaxJobs int
	// Files is the hello's files mode; protocol.FilesLocal when empty.
	Files string
	// Addr is where to listen; "127.0.0.1:0" (a fresh port) when empty. Given an address a
	// closed fake listened on, a test restarts the RTE at the same place.
	Addr string
	// Certificate is the TLS certificate to serve; a fresh self-signed one for 127.0.0.1 when
	// nil, as an RTE makes at its first start.
	Certificate *tls.Certificate
	// PlainHTTP serves without TLS (Certificate is then ignored).
	PlainHTTP bool
	// AppNode, when set, is the only X-App-Node accepted; when empty any non-empty one is.
	AppNode string
	// Refuse, when set, decides a new job's fate: the refusal to send, or nil to accept it.
	Refuse func(protocol.JobStart) *protocol.JobRefused
	// CheckAck, when set, is called for every ack as it arrives; an error it returns is kept
	// as a violation.
	CheckAck func(protocol.Ack) error
	// Raw makes the fake speak no protocol: it sends RawHello (nothing when nil) on each
	// socket, then hands every text frame to Frames and every close code to Closes.
	Raw      bool
	RawHello []byte
}

// RTE is the fake RTE. Its methods are safe for concurrent use. Close (run at the end of the
// test that started it with Start) stops it and waits for its goroutines.
type RTE struct {
	cfg Config
	der []byte

	ln  net.Listener
	srv *http.Server
	wg  sync.WaitGroup

	wmu sync.Mutex // one writer on the socket; held across a spool append and its send, so sends keep seq order

	mu         sync.Mutex
	ws         *websocket.Conn // the current socket, nil while disconnected
	conns      []*websocket.Conn
	requests   []http.Header
	jobs       map[string]*job
	offers     map[string]int // job.start messages received per job
	welcomes   []protocol.Welcome
	acks       []protocol.Ack
	violations []string
	resent     int // records sent because a welcome did not ack them

	starts   chan protocol.JobStart
	cancels  chan string
	errs     chan protocol.Error
	welcomed chan struct{}
	refusals chan string
	settings chan protocol.Settings
	upgrades chan struct{}
	frames   chan []byte
	closes   chan int
}

type job struct {
	start   protocol.JobStart
	secrets map[string]string // opened with the token
	spool   []protocol.Record // seq = index + 1
	acked   int64
	ended   bool
}

// New starts a fake RTE; Close stops it. Start is New for a test, closed when the test ends.
func New(cfg Config) (*RTE, error) {
	if cfg.Token == "" {
		return nil, errors.New("apptest: Config.Token is required")
	}
	if cfg.Name == "" {
		cfg.Name = "rte01"
	}
	if cfg.MaxJobs == 0 {
		cfg.MaxJobs = 10
	}
	if cfg.Files == "" {
		cfg.Files = protocol.FilesLocal
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	r := &RTE{
		cfg: cfg, jobs: map[string]*job{}, offers: map[string]int{},
		starts: make(chan protocol.JobStart, queue), cancels: make(chan string, queue), errs: make(chan protocol.Error, queue),
		welcomed: make(chan struct{}, queue), refusals: make(chan string, queue), settings: make(chan protocol.Settings, queue),
		upgrades: make(chan struct{}, queue), frames: make(chan []byte, queue), closes: make(chan int, queue),
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("apptest: listen %s: %w", cfg.Addr, err)
	}
	r.ln = ln
	if !cfg.PlainHTTP {
		cert := cfg.Certificate
		if cert == nil {
			c, err := SelfSigned()
			if err != nil {
				ln.Close()
				return nil, fmt.Errorf("apptest: %w", err)
			}
			cert = &c
		}
		r.der = cert.Certificate[0]
		r.ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS12})
	}
	r.srv = &http.Server{
		Handler:           http.HandlerFunc(r.serve),
		ReadHeaderTimeout: 5 * time.Second,
		// A refused certificate shows up here as a handshake error: expected, not news.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		_ = r.srv.Serve(r.ln)
	}()
	return r, nil
}

// Start starts a fake RTE for t and closes it when the test ends; it fails t when the fake
// cannot listen.
func Start(t testing.TB, cfg Config) *RTE {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// SelfSigned makes a certificate for 127.0.0.1 like the one an RTE makes at its first start.
func SelfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 96))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// URL is the address the app dials: https://127.0.0.1:port (http:// with PlainHTTP).
func (r *RTE) URL() string {
	if r.cfg.PlainHTTP {
		return "http://" + r.Addr()
	}
	return "https://" + r.Addr()
}

// Addr is the listener's address, host:port.
func (r *RTE) Addr() string { return r.ln.Addr().String() }

// Name is the RTE_NAME the hello carries.
func (r *RTE) Name() string { return r.cfg.Name }

// Token is the runner's token.
func (r *RTE) Token() string { return r.cfg.Token }

// Certificate is the served certificate, DER-encoded: what the app pins (nil with PlainHTTP).
func (r *RTE) Certificate() []byte { return r.der }

// CertificatePEM is the served certificate as the RTE sends it when it registers.
func (r *RTE) CertificatePEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.der}))
}

// Close stops the listener and every socket, and waits for all of the fake's goroutines.
func (r *RTE) Close() {
	_ = r.srv.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *RTE) serve(w http.ResponseWriter, req *http.Request) {
	// http.Server.Close does not wait for hijacked connections, so the fake counts its
	// handlers itself.
	r.wg.Add(1)
	defer r.wg.Done()
	r.mu.Lock()
	r.requests = append(r.requests, req.Header.Clone())
	r.mu.Unlock()
	if req.URL.Path != protocol.SocketPath {
		http.NotFound(w, req)
		return
	}
	if req.Header.Get("Authorization") != "Bearer "+r.cfg.Token {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	node := req.Header.Get(protocol.HeaderAppNode)
	if node == "" || (r.cfg.AppNode != "" && node != r.cfg.AppNode) {
		http.Error(w, "X-App-Node missing", http.StatusBadRequest)
		return
	}
	up := websocket.Upgrader{Subprotocols: []string{protocol.Subprotocol}}
	ws, err := up.Upgrade(w, req, nil)
	if err != nil {
		return
	}
	defer ws.Close()
	r.mu.Lock()
	r.conns = append(r.conns, ws)
	r.mu.Unlock()
	select {
	case r.upgrades <- struct{}{}:
	default:
	}
	if r.cfg.Raw {
		r.serveRaw(ws)
		return
	}
	if err := r.handshake(ws); err != nil {
		return
	}
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			r.mu.Lock()
			if r.ws == ws {
				r.ws = nil
			}
			r.mu.Unlock()
			return
		}
		m, err := protocol.Decode(data)
		if err != nil {
			r.violation("the app sent a frame that does not decode: %v: %.200s", err, data)
			continue
		}
		r.receive(ws, m)
	}
}

// serveRaw sends the raw hello and hands every frame and close code to the test.
func (r *RTE) serveRaw(ws *websocket.Conn) {
	if r.cfg.RawHello != nil {
		r.wmu.Lock()
		err := ws.WriteMessage(websocket.TextMessage, r.cfg.RawHello)
		r.wmu.Unlock()
		if err != nil {
			return
		}
	}
	r.mu.Lock()
	r.ws = ws
	r.mu.Unlock()
	for {
		kind, data, err := ws.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				select {
				case r.closes <- ce.Code:
				default:
				}
			}
			return
		}
		if kind == websocket.TextMessage {
			select {
			case r.frames <- data:
			default: // a test that stopped listening must not block the fake's shutdown
			}
		}
	}
}

// handshake sends the hello, reads the welcome and resends every spooled record it does not
// ack, in order, before anything else is sent on the socket.
func (r *RTE) handshake(ws *websocket.Conn) error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.mu.Lock()
	hello := protocol.Hello{Protocol: protocol.Version, Name: r.cfg.Name, Version: "1.2.3", Instance: "apptest", Mode: protocol.ModeInbound,
		Files: r.cfg.Files, MaxJobs: r.cfg.MaxJobs, Running: []string{}, Spooled: []protocol.SpooledJob{},
		TokenFingerprint: protocol.TokenFingerprint(r.cfg.Token), AnsibleVersion: "2.14.18"}
	for id, j := range r.jobs {
		if !j.ended {
			hello.Running = append(hello.Running, id)
		}
		if len(j.spool) > 0 && !(j.ended && j.acked == int64(len(j.spool))) {
			hello.Spooled = append(hello.Spooled, protocol.SpooledJob{Job: id, LastSeq: int64(len(j.spool))})
		}
	}
	r.mu.Unlock()
	if err := r.write(ws, hello); err != nil {
		return err
	}
	_, data, err := ws.ReadMessage()
	if err != nil {
		return err
	}
	m, err := protocol.Decode(data)
	welcome, ok := m.(*protocol.Welcome)
	if err != nil || !ok {
		r.violation("first frame from the app is %.200s (%v), want welcome", data, err)
		return errors.New("no welcome")
	}
	r.mu.Lock()
	r.welcomes = append(r.welcomes, *welcome)
	var resend []protocol.Record
	for _, sp := range hello.Spooled {
		j := r.jobs[sp.Job]
		from := welcome.Acked[sp.Job]
		if from > j.acked {
			j.acked = from
		}
		resend = append(resend, j.spool[from:]...)
	}
	r.resent += len(resend)
	r.ws = ws
	r.mu.Unlock()
	for _, rec := range resend {
		if err := r.write(ws, rec); err != nil {
			return err
		}
	}
	select {
	case r.welcomed <- struct{}{}:
	default:
	}
	return nil
}

func (r *RTE) write(ws *websocket.Conn, m protocol.Message) error {
	b, err := protocol.Encode(m)
	if err != nil {
		r.violation("the fake RTE cannot encode its own %s: %v", m.Type(), err)
		return err
	}
	return ws.WriteMessage(websocket.TextMessage, b)
}

// reply writes m on ws, unless the socket was replaced.
func (r *RTE) reply(ws *websocket.Conn, m protocol.Message) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	_ = r.write(ws, m)
}

func (r *RTE) receive(ws *websocket.Conn, m protocol.Message) {
	switch m := m.(type) {
	case *protocol.JobStart:
		r.mu.Lock()
		r.offers[m.Job]++
		_, have := r.jobs[m.Job]
		r.mu.Unlock()
		if have {
			// An RTE accepts a job it already has again and never starts it twice.
			r.reply(ws, protocol.JobAccepted{Job: m.Job})
			return
		}
		if r.cfg.Refuse != nil {
			if refusal := r.cfg.Refuse(*m); refusal != nil {
				r.reply(ws, *refusal)
				r.refusals <- m.Job
				return
			}
		}
		j := &job{start: *m, secrets: map[string]string{}}
		for name, sealed := range m.Secrets {
			plain, err := protocol.OpenSecret(r.cfg.Token, m.Job, sealed)
			if err != nil {
				r.violation("secret %s of job %s does not open with the runner's token: %v", name, m.Job, err)
			}
			j.secrets[name] = plain
		}
		r.mu.Lock()
		r.jobs[m.Job] = j
		r.mu.Unlock()
		r.reply(ws, protocol.JobAccepted{Job: m.Job})
		r.starts <- *m
	case *protocol.JobCancel:
		r.cancels <- m.Job
	case *protocol.Ack:
		var err error
		if r.cfg.CheckAck != nil {
			err = r.cfg.CheckAck(*m)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil {
			r.violations = append(r.violations, err.Error())
		}
		j := r.jobs[m.Job]
		switch {
		case j == nil:
			r.violations = append(r.violations, fmt.Sprintf("ack for job %s, which the fake RTE never had", m.Job))
		case m.Seq > int64(len(j.spool)):
			r.violations = append(r.violations, fmt.Sprintf("ack %d for job %s, beyond the %d records sent", m.Seq, m.Job, len(j.spool)))
		case m.Seq > j.acked:
			j.acked = m.Seq
		}
		r.acks = append(r.acks, *m)
	case *protocol.Error:
		r.errs <- *m
	case *protocol.Settings:
		r.settings <- *m
	}
}

func (r *RTE) violation(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}
