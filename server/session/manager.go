package session

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/socket"
)

// Jobs is what a session needs of the jobs side. Its methods are called from the session's
// reader and sender goroutines and must not block long: the socket reads nothing meanwhile.
type Jobs interface {
	// Start takes a job. nil: accepted (also for a job already running or spooled). An error
	// with a method RefusalCode() string gives the job.refused code; any other error is
	// refused "invalid". The error's text is the refusal's message, so it says what to do.
	Start(js *protocol.JobStart) error
	// Cancel stops a job's process group; false when the RTE does not run that job.
	Cancel(job string) bool
	// SetMaxJobs applies the app's max_jobs as the app sent it; Jobs decides what 0 means
	// (its own limit, RTE_MAX_JOBS).
	SetMaxJobs(n int)
	// DefaultMaxJobs is the limit when the app sets none (RTE_MAX_JOBS): hello carries it.
	DefaultMaxJobs() int
	Capacity() protocol.Capacity
	Running() []string
	// Changed is signalled whenever Capacity would answer differently.
	Changed() <-chan struct{}
}

// Outbox is the spool as a session sees it. Its methods are called from a session's reader
// (Ack) and sender (the rest) at the same time.
type Outbox interface {
	// Progress lists every job in the spool with its last seq, sorted by job.
	Progress() []protocol.SpooledJob
	// Pending calls fn for each record of job with seq > after that is not yet acked, in order
	// of seq, on the caller's goroutine; frame is the ready-to-send text frame. fn may block
	// (it waits for room in the socket's queue); an error from fn stops Pending, which returns it.
	Pending(job string, after int64, fn func(rec protocol.Record, frame []byte) error) error
	// Ack records that the app stored every record of job up to seq.
	Ack(job string, seq int64) error
	// Changed is signalled after each durable append.
	Changed() <-chan struct{}
}

// Config is what NewManager needs.
type Config struct {
	Logger   *zap.Logger           // named "session" here; nil logs nothing
	Registry prometheus.Registerer // gets the session metrics; nil: not exported
	// Hello carries the static fields of hello: name, version, instance, mode, files,
	// token_fingerprint, ansible_version, images. The Manager fills protocol, max_jobs, running and
	// spooled for each socket.
	Hello protocol.Hello
	// Jobs runs playbooks; nil (tests): every job.start is refused "invalid".
	Jobs Jobs
	// Outbox is the spool; nil: nothing is sent and acks are answered "unexpected".
	Outbox Outbox
	// Bundles is the bundle cache of RTE_FILES=transfer, which Fetch fills; nil (local mode):
	// Fetch fails and bundle frames are answered "unexpected".
	Bundles BundleStore
	// Checker answers connection checks, each off the reader goroutine; nil: every check is
	// answered "unexpected". MaxChecks bounds the checks running at once on one socket
	// (default DefaultMaxChecks); one more is answered with an error, not queued.
	Checker   Checker
	MaxChecks int

	PingInterval  time.Duration // keepalive ping; default protocol.PingInterval
	DeadAfter     time.Duration // silence that ends a socket; default protocol.DeadAfter
	HelloTimeout  time.Duration // wait for welcome after hello; default 30s
	CapacityEvery time.Duration // capacity report period; default 20s
	CloseGrace    time.Duration // see socket.Options.CloseGrace; default 1s
}

const (
	defaultHelloTimeout  = 30 * time.Second
	defaultCapacityEvery = 20 * time.Second

	// pendingSockets is how many accepted sockets may wait for Run to pick them up. More only
	// arrive when Run is not running, and those are told to come back later.
	pendingSockets = 4
	// maxPeerText bounds text from the app (node names, reasons) before it goes into a log.
	maxPeerText = 300
)

// Directions of a socket, the direction label of rte_socket_connections_total.
const (
	dirInbound  = "inbound"
	dirOutbound = "outbound"
)

// Manager holds the RTE's current socket and runs a session on it. Its methods are safe for
// concurrent use.
type Manager struct {
	cfg Config
	log *zap.Logger
	met *metrics

	incoming chan incoming // Accept -> Run
	bundles  transfers     // bundles jobs wait for (bundles.go)

	mu      sync.Mutex
	current *session
	running bool // Run has started
	closed  bool // Run is stopping: no new session starts
	nextID  uint64
	wg      sync.WaitGroup // sessions started by Run
}

type incoming struct {
	ws      *websocket.Conn
	remote  string
	appNode string
}

// NewManager builds a Manager; call Run to serve the sockets Accept takes.
func NewManager(cfg Config) *Manager {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = defaultHelloTimeout
	}
	if cfg.CapacityEvery <= 0 {
		cfg.CapacityEvery = defaultCapacityEvery
	}
	m := &Manager{
		cfg:      cfg,
		log:      cfg.Logger.Named("session"),
		met:      newMetrics(cfg.Registry),
		incoming: make(chan incoming, pendingSockets),
	}
	return m
}

// Accept takes an authenticated, upgraded inbound socket (it is the server's Acceptor). It
// returns at once; the session runs in a goroutine owned by Run. A socket accepted while Run
// is stopping is closed with 1001.
func (m *Manager) Accept(ws *websocket.Conn, r *http.Request) {
	in := incoming{ws: ws, remote: r.RemoteAddr, appNode: protocol.PeerText(r.Header.Get(protocol.HeaderAppNode), 128)}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		closeRaw(ws, websocket.CloseGoingAway, "shutting down")
		return
	}
	select {
	case m.incoming <- in:
	default:
		m.log.Warn("refused a socket: too many waiting for the session manager to run", zap.String("remote_addr", in.remote))
		closeRaw(ws, websocket.CloseTryAgainLater, "not serving yet")
	}
}

// Serve runs a session on a socket the RTE dialled and blocks until it ends. It returns why the
// socket ended, or nil when ctx ended it. The caller owns redialling; Dialer does all of it.
func (m *Manager) Serve(ctx context.Context, ws *websocket.Conn) error {
	_, err := m.serveDialled(ctx, ws, nil)
	return err
}

// Run serves the sockets Accept takes until ctx is done, then closes the current socket with
// 1001 and blocks until every session goroutine has exited. It returns nil after a shutdown.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.running {
		m.mu.Unlock()
		return errors.New("session: Run called twice")
	}
	m.running = true
	m.mu.Unlock()

	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case in := <-m.incoming:
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				_ = m.serve(ctx, in, dirInbound, nil)
			}()
		}
	}

	m.mu.Lock()
	m.closed = true
	cur := m.current
	m.mu.Unlock()
	for waiting := true; waiting; {
		select {
		case in := <-m.incoming:
			closeRaw(in.ws, websocket.CloseGoingAway, "shutting down")
		default:
			waiting = false
		}
	}
	if cur != nil {
		cur.conn.Close(websocket.CloseGoingAway, "shutting down")
	}
	m.wg.Wait()
	return nil
}

// Connected reports whether a socket is open.
func (m *Manager) Connected() bool {
	m.mu.Lock()
	cur := m.current
	m.mu.Unlock()
	if cur == nil {
		return false
	}
	select {
	case <-cur.conn.Done():
		return false
	default:
		return true
	}
}

// Welcomed reports the approval the app gave on the current socket; ok is false until the
// welcome has arrived on it.
func (m *Manager) Welcomed() (approved bool, ok bool) {
	m.mu.Lock()
	cur := m.current
	m.mu.Unlock()
	if cur == nil {
		return false, false
	}
	return cur.approval()
}

// serve runs one session on ws, replacing the current one, and returns why it ended. opened,
// when not nil, is called with the session before it runs; it must not block.
func (m *Manager) serve(ctx context.Context, in incoming, direction string, opened func(*session)) error {
	if got := in.ws.Subprotocol(); got != protocol.Subprotocol {
		closeRaw(in.ws, protocol.CloseProtocolError, "subprotocol "+protocol.Subprotocol+" was not agreed")
		return fmt.Errorf("socket from %s agreed subprotocol %q, want %q", in.remote, protocol.PeerText(got, 64), protocol.Subprotocol)
	}
	conn := socket.New(in.ws, socket.Options{
		PingInterval: m.cfg.PingInterval,
		DeadAfter:    m.cfg.DeadAfter,
		CloseGrace:   m.cfg.CloseGrace,
	})
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		conn.Close(websocket.CloseGoingAway, "shutting down")
		return errors.New("session manager is shutting down")
	}
	m.nextID++
	s := newSession(m, conn, m.log.With(
		zap.Uint64("socket", m.nextID),
		zap.String("direction", direction),
		zap.String("remote_addr", in.remote),
		zap.String("app_node", in.appNode),
	))
	prev := m.current
	m.current = s
	m.mu.Unlock()

	m.met.connected.Set(1)
	m.met.connections.WithLabelValues(direction).Inc()
	if prev != nil {
		m.met.replaced.Inc()
		prev.log.Info("replaced by a newer socket")
		prev.conn.Close(protocol.CloseReplaced, "replaced")
	}
	if opened != nil {
		opened(s)
	}
	err := s.run(ctx, prev)

	m.mu.Lock()
	if m.current == s {
		m.current = nil
		m.met.connected.Set(0)
	}
	m.mu.Unlock()
	return err
}

// closeRaw closes a socket that has no socket.Conn yet, telling the peer why.
func closeRaw(ws *websocket.Conn, code int, reason string) {
	msg := websocket.FormatCloseMessage(code, reason)
	_ = ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
	_ = ws.Close()
}
