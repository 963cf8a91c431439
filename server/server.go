package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/rte-project/rte/protocol"
)

// Acceptor takes each authenticated, upgraded socket. Accept is called on the request's
// goroutine and must not block long: it hands the socket on and returns.
type Acceptor interface {
	Accept(ws *websocket.Conn, r *http.Request)
}

// Config is what New needs. Token is required.
type Config struct {
	// Token is RTE_TOKEN, the bearer token the app presents on /rte/v1/socket; at least
	// protocol.MinTokenLength characters.
	Token string
	// MetricsToken is METRICS_TOKEN. Empty: /metrics answers 404.
	MetricsToken string
	// Logger is named "server" here; nil logs nothing.
	Logger *zap.Logger
	// Registry gets the server's collectors and is what /metrics serves. Nil: a new one.
	Registry *prometheus.Registry
	// Version is the RTE's version, a label of rte_build_info.
	Version string
	// Ready says whether the RTE can take a socket; nil func or nil error: ready. The error's
	// text is the 503 body, so it should say what is missing.
	Ready func() error
	// Sockets gets every socket that passed the token check and the upgrade. Nil (outbound
	// mode, where the RTE dials and the listener serves probes only): /rte/v1/socket is 404.
	Sockets Acceptor

	// ShutdownPause is how long /ready answers 503 before Serve closes the listener, so that a
	// load balancer or a Kubernetes Service stops routing here before connections are refused.
	// Zero: no pause (internal/rte drains jobs before it stops the server, which gives probes time).
	ShutdownPause time.Duration
	// ShutdownTimeout bounds the wait for probe and metrics requests in flight once the
	// listener is closed; connections still busy then are cut. Default 5s.
	ShutdownTimeout time.Duration
}

// HTTP server limits; see Serve.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10

	defaultShutdownTimeout = 5 * time.Second

	// maxAppNode bounds the X-App-Node header before it goes into a log.
	maxAppNode = 128
	// maxReadyText bounds the 503 body of /ready.
	maxReadyText = 300
	// metricsInFlight bounds concurrent scrapes: gathering costs CPU that jobs need, and one
	// Prometheus needs one at a time.
	metricsInFlight = 4
)

// Server is the RTE's HTTP side. Its methods are safe for concurrent use.
type Server struct {
	cfg      Config
	log      *zap.Logger
	authLog  *zap.Logger // sampled: a token-guessing client must not flood the log
	token    [32]byte    // SHA-256 of Token
	metrics  [32]byte    // SHA-256 of MetricsToken
	handler  http.Handler
	scrape   http.Handler // promhttp for cfg.Registry
	upgrader websocket.Upgrader

	authFailures *prometheus.CounterVec
	regState     *prometheus.GaugeVec
	regMu        sync.Mutex
	regSeen      map[string]bool // every state label set so far, so the old one can go to 0

	draining atomic.Bool
	stopping atomic.Bool
	served   atomic.Bool

	// pause waits out ShutdownPause; a test replaces it to hold Serve inside the pause.
	pause func(time.Duration)
}

// New checks cfg, registers the server's metrics on cfg.Registry and builds the handler.
func New(cfg Config) (*Server, error) {
	if len(cfg.Token) < protocol.MinTokenLength {
		return nil, fmt.Errorf("server: RTE_TOKEN must be at least %d characters, got %d", protocol.MinTokenLength, len(cfg.Token))
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = defaultShutdownTimeout
	}
	logger := cfg.Logger.Named("server")
	s := &Server{
		cfg: cfg,
		log: logger,
		authLog: logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			// The first 10 of each message a minute, then none: rte_auth_failures_total counts the rest.
			return zapcore.NewSamplerWithOptions(c, time.Minute, 10, 0)
		})),
		token:   sha256.Sum256([]byte(cfg.Token)),
		metrics: sha256.Sum256([]byte(cfg.MetricsToken)),
		upgrader: websocket.Upgrader{
			Subprotocols: []string{protocol.Subprotocol},
			// gorilla's default origin check stays: it refuses a browser page from another
			// origin. The app is no browser and sends no Origin header, so it passes.
		},
		regSeen: map[string]bool{},
		pause:   time.Sleep,
	}
	if err := s.registerMetrics(); err != nil {
		return nil, err
	}
	s.scrape = promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{
		ErrorLog:            zap.NewStdLog(logger.Named("metrics")),
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: metricsInFlight,
	})
	mux := http.NewServeMux()
	if cfg.Sockets != nil {
		// The socket path takes every method so the token is checked first; the upgrade then
		// refuses anything but GET.
		mux.HandleFunc(protocol.SocketPath, s.serveSocket)
	}
	mux.HandleFunc("GET /live", s.serveLive)
	mux.HandleFunc("GET /ready", s.serveReady)
	// /metrics takes every method so that, without METRICS_TOKEN, it is 404 for all of them.
	mux.HandleFunc("/metrics", s.serveMetrics)
	s.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// ServeMux answers a path that is not clean (//rte/v1/socket, /a/../live) with a
		// redirect to the clean one, which tells a prober what is served and hands a client
		// a Location it did not ask for. The RTE serves its paths as written, nothing else.
		if p := r.URL.Path; p != "/" && path.Clean(p) != p {
			http.NotFound(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
	return s, nil
}

// Handler serves every endpoint; Serve uses it, and tests may mount it on their own server.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves on ln (wrap it with tls.NewListener before, for HTTPS=1) until ctx is done,
// then shuts down gracefully: /ready answers 503 at once, ShutdownPause passes, the listener
// closes, and probe and metrics requests in flight get up to ShutdownTimeout to finish. It
// does not wait for upgraded WebSockets: they belong to the Acceptor, which must close them.
// Serve returns nil after a shutdown, or the error that stopped the listener; it may be
// called once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if !s.served.CompareAndSwap(false, true) {
		return errors.New("server: Serve called twice")
	}
	srv := &http.Server{
		Handler: s.handler,
		// A client gets 10s to send its headers: without a bound, a client that trickles them
		// holds a connection and a goroutine for as long as it likes.
		ReadHeaderTimeout: readHeaderTimeout,
		// No endpoint reads a body, so a whole request is read long before 30s; the write
		// bound keeps a client that stops reading a /metrics answer from pinning it. gorilla
		// clears both deadlines when it takes over a WebSocket, so sockets are not cut.
		ReadTimeout:  readTimeout,
		WriteTimeout: writeTimeout,
		// Probes and scrapes come every few seconds and reuse their connection; one idle for
		// two minutes is gone, and its file descriptor is freed.
		IdleTimeout: idleTimeout,
		// A bearer token and the WebSocket handshake fit in a few KiB; the 1 MiB default would
		// let every connection pin a megabyte of headers.
		MaxHeaderBytes: maxHeaderBytes,
		ErrorLog:       log.New(httpErrorLog{s.log.Named("http")}, "", 0),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	s.log.Info("listening", zap.String("addr", ln.Addr().String()))
	select {
	case err := <-served:
		return fmt.Errorf("serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	s.stopping.Store(true)
	s.log.Info("shutting down: /ready answers 503", zap.Duration("pause", s.cfg.ShutdownPause))
	if s.cfg.ShutdownPause > 0 {
		s.pause(s.cfg.ShutdownPause)
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		s.log.Warn("requests still running at shutdown were cut", zap.Duration("waited", s.cfg.ShutdownTimeout), zap.Error(err))
		_ = srv.Close()
	}
	<-served // http.ErrServerClosed, once Shutdown or Close has stopped the listener
	s.log.Info("stopped listening")
	return nil
}

// SetDraining makes /ready answer 503 from now on: the RTE takes no new work.
func (s *Server) SetDraining() { s.draining.Store(true) }

// SetRegistrationState sets rte_registration_state{state} to 1 and every state set before to 0.
func (s *Server) SetRegistrationState(state string) {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	for old := range s.regSeen {
		if old != state {
			s.regState.WithLabelValues(old).Set(0)
		}
	}
	s.regSeen[state] = true
	s.regState.WithLabelValues(state).Set(1)
}

func (s *Server) serveSocket(w http.ResponseWriter, r *http.Request) {
	node := protocol.PeerText(r.Header.Get(protocol.HeaderAppNode), maxAppNode)
	if reason := checkBearer(r, s.token); reason != "" {
		s.refuse(w, r, "socket", reason, node, "RTE_TOKEN")
		return
	}
	if !slices.Contains(websocket.Subprotocols(r), protocol.Subprotocol) {
		http.Error(w, "ask for WebSocket subprotocol "+protocol.Subprotocol+" (header Sec-WebSocket-Protocol)", http.StatusBadRequest)
		return
	}
	ws, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		// gorilla has answered the client already, with the reason.
		s.authLog.Warn("websocket upgrade refused", zap.String("remote_addr", r.RemoteAddr), zap.String("app_node", node), zap.Error(err))
		return
	}
	s.log.Debug("socket upgraded", zap.String("remote_addr", r.RemoteAddr), zap.String("app_node", node))
	s.cfg.Sockets.Accept(ws, r)
}

func (s *Server) serveLive(w http.ResponseWriter, _ *http.Request) {
	probeHeaders(w)
	_, _ = w.Write([]byte("ok\n"))
}

func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	probeHeaders(w)
	if reason := s.notReady(); reason != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(reason + "\n"))
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

// notReady is why /ready answers 503, or "" when it answers 200.
func (s *Server) notReady() string {
	switch {
	case s.stopping.Load():
		return "shutting down"
	case s.draining.Load():
		return "draining: taking no new jobs"
	case s.cfg.Ready == nil:
		return ""
	}
	if err := s.cfg.Ready(); err != nil {
		return "not ready: " + protocol.PeerText(err.Error(), maxReadyText)
	}
	return ""
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if s.cfg.MetricsToken == "" {
		http.NotFound(w, r)
		return
	}
	if reason := checkBearer(r, s.metrics); reason != "" {
		s.refuse(w, r, "metrics", reason, "", "METRICS_TOKEN")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "use GET", http.StatusMethodNotAllowed)
		return
	}
	s.scrape.ServeHTTP(w, r)
}

// refuse answers 401, counts it and logs it without the presented token.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, endpoint, reason, node, setting string) {
	s.authFailures.WithLabelValues(endpoint, reason).Inc()
	s.authLog.Warn("refused a request without the right bearer token",
		zap.String("endpoint", endpoint), zap.String("reason", reason),
		zap.String("remote_addr", r.RemoteAddr), zap.String("app_node", node))
	w.Header().Set("WWW-Authenticate", `Bearer realm="rte"`)
	http.Error(w, reason+" bearer token: send Authorization: Bearer <"+setting+">", http.StatusUnauthorized)
}

// Reasons of a refused token, the reason label of rte_auth_failures_total.
const (
	authMissing = "missing"
	authWrong   = "wrong"
)

// checkBearer compares the request's bearer token with the one whose SHA-256 is want and
// returns "" when they match, else authMissing or authWrong. Comparing digests in constant
// time keeps both the token's bytes and its length out of the timing.
func checkBearer(r *http.Request, want [32]byte) string {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return authMissing
	}
	got := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return authWrong
	}
	return ""
}

func probeHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
}

// httpErrorLog carries net/http's own complaints into zap. TLS handshake failures go to debug:
// port scanners and TCP probes cause them by the hundred and they say nothing actionable.
type httpErrorLog struct{ log *zap.Logger }

func (h httpErrorLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	if strings.Contains(msg, "TLS handshake error") {
		h.log.Debug(msg)
	} else {
		h.log.Warn(msg)
	}
	return len(p), nil
}
