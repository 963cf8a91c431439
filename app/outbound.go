package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/socket"
)

// rejectedFlush is how long Reject lets the writer put the rejected message on the wire before
// the 4003 close. socket.Conn.Close writes the close frame beside the writer, not behind the
// frames queued before it, so without the pause the close could overtake the message. The
// close frame carries the reason as well, so an RTE learns it even when the pause was short.
const rejectedFlush = 250 * time.Millisecond

// outbound holds the sockets of outbound runners, which dialled the app: the one socket per
// runner that Approve and Reject talk to, and the stop that closes them all when Run returns.
type outbound struct {
	// refusals logs refused sockets, sampled: anyone who reaches the app can knock, and the
	// log must not become their megaphone.
	refusals *zap.Logger

	mu      sync.Mutex
	peers   map[string]*outboundPeer // by runner name
	stopped bool
	wg      sync.WaitGroup // one per socket being served
	// stop is cancelled when Run returns; every socket's context ends with it. An http.Server
	// does not wait for, or close, the connections its handlers hijacked.
	stop   context.Context
	cancel context.CancelFunc
}

// outboundPeer is one outbound runner's socket while its handler serves it.
type outboundPeer struct {
	conn *socket.Conn
	done chan struct{} // closed when the handler is done with the socket
	// approved is set once {"type":"approved"} was sent on this socket, by an Approve here or
	// on another app node (tellApprovedOnce).
	approved atomic.Bool
}

func newOutbound(log *zap.Logger) *outbound {
	stop, cancel := context.WithCancel(context.Background())
	return &outbound{
		refusals: log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			// The first 10 of each message a minute, then none.
			return zapcore.NewSamplerWithOptions(c, time.Minute, 10, 0)
		})),
		peers:  map[string]*outboundPeer{},
		stop:   stop,
		cancel: cancel,
	}
}

// enter counts a socket in, unless Run has stopped.
func (o *outbound) enter() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stopped {
		return false
	}
	o.wg.Add(1)
	return true
}

// shutdown closes every outbound socket and waits until their handlers are done. Sockets that
// arrive afterwards are refused with 503.
func (o *outbound) shutdown() {
	o.mu.Lock()
	o.stopped = true
	o.mu.Unlock()
	o.cancel()
	o.wg.Wait()
}

// peer returns the runner's connected outbound socket, or nil.
func (o *outbound) peer(name string) *outboundPeer {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.peers[name]
}

// serveOutbound is GET protocol.OutboundSocketPath, where outbound runners dial in
// (PROTOCOL.md sections 1 and 4). Everything a refusal needs is decided before the upgrade and
// answered as an HTTP status with a JSON {"error"}: 401 for a token or name the app does not
// hold together, 403 for a runner it refuses, 429 when too many wait for approval. A first
// join (a name and a token the app does not know) becomes a waiting runner whose socket the
// app keeps, welcomed with approved false, until an admin approves or rejects it. After the
// handshake the socket is served like an inbound runner's: records, acks, dispatch, capacity.
func (a *App) serveOutbound(w http.ResponseWriter, req *http.Request) {
	name := req.Header.Get(protocol.HeaderRTEName)
	token := bearer(req)
	refuse := func(status int, format string, args ...any) {
		ans := refused(status, format, args...)
		fp := ""
		if token != "" {
			fp = protocol.TokenFingerprint(token)
		}
		a.out.refusals.Warn("outbound socket refused",
			zap.String("remote_addr", req.RemoteAddr), zap.String("name", protocol.PeerText(name, maxNameBytes)),
			zap.String("token_fingerprint", fp), zap.Int("status", status), zap.String("error", ans.body.Error))
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="rte"`)
		}
		writeAnswer(w, ans)
	}
	if !a.out.enter() {
		refuse(http.StatusServiceUnavailable, "the app is shutting down: the RTE dials again")
		return
	}
	defer a.out.wg.Done()

	switch {
	case req.Method != http.MethodGet:
		w.Header().Set("Allow", http.MethodGet)
		refuse(http.StatusMethodNotAllowed, "the outbound socket is GET %s with a WebSocket upgrade", protocol.OutboundSocketPath)
		return
	case !websocket.IsWebSocketUpgrade(req):
		refuse(http.StatusBadRequest, "this is the endpoint where RTEs in outbound mode open their WebSocket: send a WebSocket upgrade (Connection: Upgrade, Upgrade: websocket)")
		return
	case !slices.Contains(websocket.Subprotocols(req), protocol.Subprotocol):
		refuse(http.StatusBadRequest, "ask for WebSocket subprotocol %s (header Sec-WebSocket-Protocol): this app speaks RTE protocol v%d", protocol.Subprotocol, protocol.Version)
		return
	case token == "":
		refuse(http.StatusUnauthorized, "no bearer token: send Authorization: Bearer <RTE_TOKEN>")
		return
	case name == "":
		refuse(http.StatusBadRequest, "%s is required: the RTE sends its RTE_NAME", protocol.HeaderRTEName)
		return
	}
	if err := checkName(name); err != nil {
		refuse(http.StatusBadRequest, "%s: %s", protocol.HeaderRTEName, err)
		return
	}
	if len(token) < protocol.MinTokenLength || strings.IndexFunc(token, unicode.IsControl) >= 0 {
		refuse(http.StatusUnauthorized, "the token is no runner's: a runner's token is at least %d printable characters; set RTE_TOKEN", protocol.MinTokenLength)
		return
	}
	joinToken := req.Header.Get(protocol.HeaderJoinToken)
	ans, err := a.admitOutbound(req.Context(), name, token, joinToken, req.RemoteAddr)
	if err != nil {
		a.log.Error("outbound socket refused: the app could not read or store the runner", zap.String("name", name), zap.Error(err))
		refuse(http.StatusInternalServerError, "the app could not read or store the runner; the RTE dials again")
		return
	}
	if ans != nil {
		refuse(ans.status, "%s", ans.body.Error)
		return
	}

	upgrader := websocket.Upgrader{
		Subprotocols: []string{protocol.Subprotocol},
		Error: func(w http.ResponseWriter, _ *http.Request, status int, reason error) {
			refuse(status, "websocket upgrade: %s", protocol.PeerText(reason.Error(), 200))
		},
	}
	ws, err := upgrader.Upgrade(w, req, nil)
	if err != nil {
		return // answered by Error
	}
	// Until socket.New sets its own, gorilla reads a frame of any size; the hello is small.
	ws.SetReadLimit(pinning.ReadLimit)

	ctx, cancel := context.WithCancel(req.Context())
	defer cancel()
	defer context.AfterFunc(a.out.stop, cancel)()
	a.serveOutboundSocket(ctx, ws, name, token, req.RemoteAddr)
}

// serveOutboundSocket runs the handshake and then the runner's socket, until it ends.
func (a *App) serveOutboundSocket(ctx context.Context, ws *websocket.Conn, name, token, remoteAddr string) {
	log := a.log.With(zap.String("runner", name), zap.String("remote_addr", remoteAddr))
	wait, release := a.bindDeadline(ctx, ws)
	hello, err := readHello(ctx, ws, wait)
	release()
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		_ = ws.Close()
		log.Warn("outbound runner's socket ended before its hello", zap.Error(err))
		return
	}
	acked, err := a.ackedFor(ctx, name, hello.Spooled)
	if err != nil {
		closeWS(ws, websocket.CloseInternalServerErr, "app could not read its jobs")
		log.Error("outbound runner's socket closed: the app could not read its jobs for the welcome", zap.Error(err))
		return
	}
	conn := socket.New(ws, socket.Options{PingInterval: a.cfg.PingInterval, DeadAfter: a.cfg.DeadAfter})
	op, welcome, prev, err := a.attachOutbound(ctx, name, token, remoteAddr, hello, acked, conn)
	if err != nil {
		var gone *removedError
		if errors.As(err, &gone) {
			closeWS(ws, protocol.CloseRejected, "the runner was removed at the app")
			log.Info("outbound runner's socket closed: the runner was removed while its hello was on the way")
			return
		}
		closeWS(ws, websocket.CloseInternalServerErr, "app could not store the runner")
		log.Error("outbound runner's socket closed: the app could not store the runner", zap.Error(err))
		return
	}
	defer a.detachOutbound(name, op)
	// Other app nodes learn that this node holds the runner's socket, and one holding an older
	// socket of it closes that.
	a.holdOutbound(ctx, name)
	defer a.dropOutbound(name)
	if prev != nil {
		// One socket per runner: the RTE holds one at a time, so an older one is a leftover
		// the RTE has given up on, or another RTE with the same name and token.
		prev.conn.Close(protocol.CloseReplaced, "replaced by a newer socket of this runner")
		select {
		case <-prev.done:
		case <-ctx.Done():
			conn.Close(websocket.CloseGoingAway, "app stopping")
			return
		}
	}
	if hello.Name != name {
		log.Warn("runner calls itself by another name in its hello than in X-RTE-Name; the token matched, so the app carries on",
			zap.String("hello_name", protocol.PeerText(hello.Name, maxNameBytes)))
	}
	fields := []zap.Field{
		zap.Bool("approved", welcome.Approved),
		zap.String("token_fingerprint", protocol.TokenFingerprint(token)),
		zap.String("version", protocol.PeerText(hello.Version, 64)),
		zap.String("ansible_version", protocol.PeerText(hello.AnsibleVersion, 64)),
		zap.String("files", hello.Files),
		zap.Int("running", len(hello.Running)),
		zap.Int("spooled", len(hello.Spooled)),
	}
	if welcome.Approved {
		log.Info("outbound runner connected", fields...)
	} else {
		log.Info("outbound runner connected and waiting for an admin to approve it after comparing the token fingerprint with the RTE's log", fields...)
	}
	why := a.serve(ctx, &Peer{Runner: name, Hello: *hello, Welcome: welcome, Conn: conn})
	if ctx.Err() == nil {
		log.Info("outbound runner's socket ended", zap.Error(why))
	}
}

// removedError is a runner removed (rejected, or dropped as an expired request) between the
// token check and its hello.
type removedError struct{ name string }

func (e *removedError) Error() string { return fmt.Sprintf("runner %q was removed", e.name) }

// admitOutbound decides, before the upgrade, whether the runner's socket is taken, and records
// a first join. A non-nil answer is the refusal; an error is a store failure.
func (a *App) admitOutbound(ctx context.Context, name, token, joinToken, remoteAddr string) (*answer, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	runners, err := a.pruneLocked(ctx)
	if err != nil {
		return nil, err
	}
	var byName, byToken *Runner
	for _, r := range runners {
		// Every runner's token is compared, in constant time, so the answer's timing tells
		// neither which runner nor how much of a guess matched.
		matches := equalSecret(token, r.Token)
		switch {
		case r.Name == name:
			byName = r
		case matches && byToken == nil:
			byToken = r
		}
	}
	fail := func(status int, format string, args ...any) (*answer, error) {
		ans := refused(status, format, args...)
		return &ans, nil
	}
	now := a.cfg.Now()

	if byName != nil && equalSecret(token, byName.Token) {
		r := byName
		if r.Mode == ModeDatabase {
			// Database mode's end: the RTE proved it is this runner (seed.go).
			if ans, err := a.leaveDatabaseModeLocked(ctx, r); ans != nil || err != nil {
				return ans, err
			}
		}
		switch {
		case r.Mode != protocol.ModeOutbound:
			return fail(http.StatusForbidden, "runner %q is an %s runner at the app, which the app dials itself: set RTE_MODE=%s on this RTE, or have an admin remove the runner so that it can join in outbound mode", name, r.Mode, r.Mode)
		case r.State == StateApproved:
			// A join token on an approved runner is ignored, not refused: RTE_JOIN_TOKEN stays
			// set across restarts, and a rotated app join token must not lock out runners it
			// no longer concerns.
			return nil, nil
		case joinToken == "":
			return nil, nil
		}
		if ans := a.checkJoinToken(joinToken); ans != nil {
			return ans, nil
		}
		r.State, r.ApprovedAt, r.RemoteAddr = StateApproved, now, remoteAddr
		if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
			return nil, fmt.Errorf("approve runner %q by join token: %w", name, err)
		}
		a.log.Info("outbound runner approved by the join token", zap.String("name", name), zap.String("token_fingerprint", r.TokenFingerprint))
		return nil, nil
	}
	if byToken != nil {
		return fail(http.StatusUnauthorized, "the token belongs to another runner than %q: set RTE_NAME to the name the app knows this RTE by, or give each RTE its own RTE_TOKEN", name)
	}
	if joinToken != "" {
		if ans := a.checkJoinToken(joinToken); ans != nil {
			return ans, nil
		}
	}
	if byName != nil {
		if joinToken != "" {
			return fail(http.StatusForbidden, "runner %q is %s at the app with another token: a join token does not take over a runner; restore this RTE's RTE_TOKEN, choose another RTE_NAME, or have an admin remove the runner",
				name, byName.State)
		}
		// No fingerprint in the answer: the caller proved nothing, and the runner's token
		// fingerprint is the admin's to compare, not a stranger's to learn.
		return fail(http.StatusUnauthorized, "the token is not the one of runner %q: restore this RTE's RTE_TOKEN (its fingerprint is in the RTE's log; compare it with the runner page), choose another RTE_NAME, or have an admin remove the runner so that this RTE can join anew",
			name)
	}

	// A first join: neither the name nor the token is known.
	joined := joinToken != ""
	if why := a.waitingFull(runners, remoteAddr); !joined && why != "" {
		return fail(http.StatusTooManyRequests, "%s", why)
	}
	r := &Runner{
		Name: name, Mode: protocol.ModeOutbound, State: StateWaiting,
		Token: token, TokenFingerprint: protocol.TokenFingerprint(token),
		RemoteAddr: remoteAddr, RequestedAt: now,
	}
	if joined {
		r.State, r.ApprovedAt = StateApproved, now
	}
	if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
		return nil, fmt.Errorf("store runner %q: %w", name, err)
	}
	if joined {
		a.log.Info("outbound runner joined with the join token and is approved",
			zap.String("name", name), zap.String("token_fingerprint", r.TokenFingerprint), zap.String("remote_addr", remoteAddr))
	} else {
		a.log.Info("outbound runner asks to join; it waits for an admin",
			zap.String("name", name), zap.String("token_fingerprint", r.TokenFingerprint), zap.String("remote_addr", remoteAddr))
	}
	return nil, nil
}

// checkJoinToken refuses a join token that is not the app's.
func (a *App) checkJoinToken(joinToken string) *answer {
	if a.cfg.JoinToken == "" {
		ans := refused(http.StatusForbidden, "this app accepts no join token: remove RTE_JOIN_TOKEN, and an admin approves the runner instead")
		return &ans
	}
	if !equalSecret(joinToken, a.cfg.JoinToken) {
		ans := refused(http.StatusForbidden, "%s is not the app's join token: set RTE_JOIN_TOKEN to the app's current join token, or remove it and have an admin approve the runner", protocol.HeaderJoinToken)
		return &ans
	}
	return nil
}

// attachOutbound records the handshake on the runner, queues the welcome on conn and makes
// conn the runner's socket, all under the runners' lock: an Approve either happened before
// (and the welcome says approved) or finds the socket and sends approved after the welcome.
// prev is the runner's older socket, which the caller closes.
func (a *App) attachOutbound(ctx context.Context, name, token, remoteAddr string, hello *protocol.Hello, acked map[string]int64, conn *socket.Conn) (op *outboundPeer, welcome protocol.Welcome, prev *outboundPeer, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := a.cfg.Store.GetRunner(ctx, name)
	if errors.Is(err, ErrNotFound) || (err == nil && (!equalSecret(token, r.Token) || r.Mode != protocol.ModeOutbound)) {
		return nil, welcome, nil, &removedError{name: name}
	}
	if err != nil {
		return nil, welcome, nil, fmt.Errorf("read runner %q: %w", name, err)
	}
	r.LastSeen = a.cfg.Now()
	r.Version = protocol.PeerText(hello.Version, 64)
	r.Files = hello.Files
	r.Images = hello.Images
	r.RemoteAddr = remoteAddr
	if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
		return nil, welcome, nil, fmt.Errorf("update runner %q: %w", name, err)
	}
	welcome = protocol.Welcome{Protocol: protocol.Version, Node: a.cfg.Node, Approved: r.State == StateApproved, MaxJobs: r.MaxJobs, Acked: acked, Features: a.features()}
	// The writer starts later, in serve; the queue keeps the welcome first.
	if err := conn.Send(ctx, welcome); err != nil {
		return nil, welcome, nil, fmt.Errorf("queue the welcome: %w", err)
	}
	op = &outboundPeer{conn: conn, done: make(chan struct{})}
	a.out.mu.Lock()
	prev = a.out.peers[name]
	a.out.peers[name] = op
	a.out.mu.Unlock()
	return op, welcome, prev, nil
}

// detachOutbound forgets the runner's socket, unless a newer one took its place.
func (a *App) detachOutbound(name string, op *outboundPeer) {
	a.out.mu.Lock()
	if a.out.peers[name] == op {
		delete(a.out.peers, name)
	}
	a.out.mu.Unlock()
	close(op.done)
}

// tellApproved sends approved to the runner's outbound socket when it has one; Approve calls
// it with a.mu held, before it stores the approval, so that no job.start can reach the runner
// ahead of the message (Submit refuses jobs until the approval is stored). undo closes the
// socket when storing fails: the RTE dials again and hears the stored state in its welcome.
func (a *App) tellApproved(ctx context.Context, r *Runner) (undo func()) {
	op := a.out.peer(r.Name)
	if op == nil || r.Mode != protocol.ModeOutbound {
		return func() {}
	}
	op.approved.Store(true)
	if err := op.conn.Send(ctx, protocol.Approved{}); err != nil {
		a.log.Info("approved runner's socket is closing; it hears the approval in its next welcome", zap.String("name", r.Name), zap.Error(err))
	}
	return func() { op.conn.Close(websocket.CloseInternalServerErr, "app could not store the approval") }
}

// tellRejected sends rejected to an outbound runner's socket and closes it with 4003, so the
// RTE logs the reason and stays away for long. It blocks for at most rejectedFlush.
func (a *App) tellRejected(ctx context.Context, op *outboundPeer, reason string) {
	reason = protocol.PeerText(reason, 300)
	_ = op.conn.Send(ctx, protocol.Rejected{Reason: reason})
	t := time.NewTimer(rejectedFlush)
	defer t.Stop()
	select {
	case <-t.C:
	case <-op.conn.Done():
	case <-ctx.Done():
	}
	closeReason := "rejected"
	if reason != "" {
		closeReason += ": " + reason
	}
	op.conn.Close(protocol.CloseRejected, closeReason)
}

// bearer returns the request's bearer token, or "".
func bearer(req *http.Request) string {
	scheme, token, ok := strings.Cut(req.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}
