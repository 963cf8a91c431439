package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"

	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/socket"
)

// Connect dials an approved inbound runner at its URL, over its approved certificate, and does
// the app's half of the handshake: it reads the runner's hello (waiting at most HelloTimeout),
// closes with 4400 when the runner speaks another protocol version, and answers with welcome,
// whose acked gives, for each job the hello lists as spooled, the highest seq the store holds
// with every seq before it. It blocks until then and starts no goroutine; the caller runs the
// returned Peer (Run does all of this itself).
//
// The certificate is checked inside the TLS handshake, before the token is sent. A runner that
// presents another certificate than the approved one is never dialled again silently: Connect
// returns the *pinning.MismatchError (wrapped; its message names both fingerprints), and the
// runner goes back to waiting with the presented certificate pending, so an admin must approve
// it. A runner without any pin (added by hand or seed) gets the same treatment on its first
// dial, trust on first use, with the *pinning.UnpinnedError wrapped. A runner added with a
// CertificateSHA256 has the first certificate that matches it pinned from then on.
func (a *App) Connect(ctx context.Context, name string) (*Peer, error) {
	r, err := a.cfg.Store.GetRunner(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("connect runner %q: %w", name, err)
	}
	if r.Mode != protocol.ModeInbound {
		return nil, fmt.Errorf("connect runner %q: it is an %s runner, which dials the app itself", name, r.Mode)
	}
	if r.State != StateApproved {
		return nil, fmt.Errorf("connect runner %q: it is %s, not approved: an admin must approve it (pending certificate %s) before the app dials it",
			name, r.State, fingerprintOrEmpty(r.PendingCertificate))
	}
	var pin pinning.Pin
	if isHTTPS(r.URL) {
		pin.DER = r.Certificate
		if pin.DER == nil {
			pin.SHA256 = r.CertificateSHA256
		}
	}
	dialer := pinning.Dialer{Token: r.Token, Node: a.cfg.Node, Timeout: a.cfg.DialTimeout, Proxy: a.cfg.Proxy}
	ws, presented, err := dialer.Dial(ctx, r.URL, pin)
	if err != nil {
		var mismatch *pinning.MismatchError
		var unpinned *pinning.UnpinnedError
		switch {
		case errors.As(err, &mismatch):
			return nil, errors.Join(
				fmt.Errorf("connect runner %q: %w; the runner now waits for an admin to approve the presented certificate", name, err),
				a.holdForApproval(ctx, r, mismatch.PresentedDER))
		case errors.As(err, &unpinned):
			return nil, errors.Join(
				fmt.Errorf("connect runner %q: %w; the runner waits for approval of this certificate (trust on first use)", name, err),
				a.holdForApproval(ctx, r, unpinned.PresentedDER))
		}
		return nil, fmt.Errorf("connect runner %q: %w", name, err)
	}
	if r.Certificate == nil && presented != nil && pin.SHA256 != "" {
		if err := a.pinMatched(ctx, r, presented); err != nil {
			closeWS(ws, websocket.CloseGoingAway, "app could not store the certificate")
			return nil, fmt.Errorf("connect runner %q: %w", name, err)
		}
	}
	hello, welcome, err := a.handshake(ctx, ws, r)
	if err != nil {
		return nil, fmt.Errorf("connect runner %q at %s: %w", name, r.URL, err)
	}
	if hello.Name != name {
		a.log.Warn("runner calls itself by another name than the app does; the token matched, so the app carries on",
			zap.String("name", name), zap.String("hello_name", protocol.PeerText(hello.Name, maxNameBytes)))
	}
	if err := a.markSeen(ctx, name, hello); err != nil {
		closeWS(ws, websocket.CloseGoingAway, "app could not store the runner")
		return nil, fmt.Errorf("connect runner %q: %w", name, err)
	}
	a.log.Info("runner connected",
		zap.String("name", name),
		zap.String("url", r.URL),
		zap.String("version", protocol.PeerText(hello.Version, 64)),
		zap.String("ansible_version", protocol.PeerText(hello.AnsibleVersion, 64)),
		zap.String("files", hello.Files),
		zap.Int("running", len(hello.Running)),
		zap.Int("spooled", len(hello.Spooled)))
	conn := socket.New(ws, socket.Options{PingInterval: a.cfg.PingInterval, DeadAfter: a.cfg.DeadAfter})
	return &Peer{Runner: name, Hello: hello, Welcome: welcome, Conn: conn}, nil
}

// holdForApproval puts a runner whose dial met an unapproved certificate back to waiting, with
// that certificate pending. It changes nothing when an admin acted since the dial started.
func (a *App) holdForApproval(ctx context.Context, dialled *Runner, presented []byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := a.cfg.Store.GetRunner(ctx, dialled.Name)
	if err != nil {
		return fmt.Errorf("hold runner %q for approval: %w", dialled.Name, err)
	}
	if r.State != StateApproved || !bytes.Equal(r.Certificate, dialled.Certificate) || r.URL != dialled.URL {
		return nil
	}
	r.State = StateWaiting
	r.PendingCertificate = bytes.Clone(presented)
	r.RequestedAt = a.cfg.Now()
	if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
		return fmt.Errorf("hold runner %q for approval: %w", r.Name, err)
	}
	a.log.Warn("runner presented a certificate that is not approved; it waits for an admin, and the app will not dial it until then",
		zap.String("name", r.Name),
		zap.String("url", r.URL),
		zap.String("approved_certificate_fingerprint", fingerprintOrEmpty(r.Certificate)),
		zap.String("configured_certificate_sha256", r.CertificateSHA256),
		zap.String("presented_certificate_fingerprint", protocol.CertificateFingerprint(presented)),
		zap.String("presented_certificate_sha256", protocol.CertificateSHA256(presented)))
	return nil
}

// pinMatched stores the certificate that matched a runner's configured SHA-256, so later dials
// compare the whole certificate.
func (a *App) pinMatched(ctx context.Context, dialled *Runner, der []byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := a.cfg.Store.GetRunner(ctx, dialled.Name)
	if err != nil {
		return fmt.Errorf("pin certificate of runner %q: %w", dialled.Name, err)
	}
	if r.Certificate != nil || r.CertificateSHA256 != dialled.CertificateSHA256 {
		return nil
	}
	r.Certificate = bytes.Clone(der)
	if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
		return fmt.Errorf("pin certificate of runner %q: %w", r.Name, err)
	}
	a.log.Info("runner certificate matched the configured fingerprint and is pinned",
		zap.String("name", r.Name),
		zap.String("certificate_fingerprint", protocol.CertificateFingerprint(der)),
		zap.String("certificate_sha256", r.CertificateSHA256))
	return nil
}

func (a *App) markSeen(ctx context.Context, name string, hello protocol.Hello) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := a.cfg.Store.GetRunner(ctx, name)
	if err != nil {
		return fmt.Errorf("update runner %q: %w", name, err)
	}
	r.LastSeen = a.cfg.Now()
	r.Version = protocol.PeerText(hello.Version, 64)
	r.Files = hello.Files
	r.Images = hello.Images
	if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
		return fmt.Errorf("update runner %q: %w", name, err)
	}
	return nil
}

// handshake reads the hello and writes the welcome on a socket no other goroutine uses yet. On
// failure it closes the socket.
func (a *App) handshake(ctx context.Context, ws *websocket.Conn, r *Runner) (hello protocol.Hello, welcome protocol.Welcome, err error) {
	wait, release := a.bindDeadline(ctx, ws)
	defer func() {
		release()
		if err == nil && ctx.Err() != nil {
			err = ctx.Err()
		}
		if err != nil {
			_ = ws.Close()
		}
	}()
	h, err := readHello(ctx, ws, wait)
	if err != nil {
		return hello, welcome, err
	}
	acked, err := a.ackedFor(ctx, r.Name, h.Spooled)
	if err != nil {
		closeWS(ws, websocket.CloseInternalServerErr, "app could not read its jobs")
		return hello, welcome, err
	}
	welcome = protocol.Welcome{Protocol: protocol.Version, Node: a.cfg.Node, Approved: true, MaxJobs: r.MaxJobs, Acked: acked, Features: a.features()}
	frame, err := protocol.Encode(welcome)
	if err != nil {
		return hello, welcome, err
	}
	if err := ws.WriteMessage(websocket.TextMessage, frame); err != nil {
		return hello, welcome, fmt.Errorf("write welcome: %w", err)
	}
	return *h, welcome, nil
}

// bindDeadline bounds reads and writes on ws by HelloTimeout, or ctx's deadline when that is
// sooner, and returns the bound. A blocked read can only be abandoned through its deadline, so
// until release is called, cancelling ctx moves both deadlines into the past. release returns
// once that can no longer happen.
func (a *App) bindDeadline(ctx context.Context, ws *websocket.Conn) (wait time.Duration, release func()) {
	wait = a.cfg.HelloTimeout
	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline, wait = d, time.Until(d)
	}
	_ = ws.SetReadDeadline(deadline)
	_ = ws.SetWriteDeadline(deadline)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		past := time.Unix(1, 0)
		_ = ws.SetReadDeadline(past)
		_ = ws.SetWriteDeadline(past)
	})
	return wait, func() {
		if !stop() {
			<-fired
		}
	}
}

// readHello reads the runner's first message, which must be a hello of this protocol version.
// A runner that speaks another version is closed with 4400, which says why; a bad hello gets
// an error message and a close with 1002. wait is the read's bound, for the error message.
func readHello(ctx context.Context, ws *websocket.Conn, wait time.Duration) (*protocol.Hello, error) {
	kind, data, err := ws.ReadMessage()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, fmt.Errorf("no hello within %s: whatever answers there accepted the socket but does not speak protocol v%d", wait.Round(time.Millisecond), protocol.Version)
		}
		return nil, fmt.Errorf("read hello: %w", err)
	}
	if kind != websocket.TextMessage {
		closeWS(ws, protocol.CloseProtocolError, "hello expected")
		return nil, errors.New("the runner's first frame is binary, not hello")
	}
	// The version is read before the full decode: a newer hello may not validate as a v1 one,
	// and the runner must hear 4400, which says why, not a complaint about a field.
	var head struct {
		Type     string `json:"type"`
		Protocol *int   `json:"protocol"`
	}
	if json.Unmarshal(data, &head) == nil && head.Type == protocol.TypeHello && head.Protocol != nil && *head.Protocol != protocol.Version {
		closeWS(ws, protocol.CloseUnsupportedProtoV, fmt.Sprintf("protocol %d not supported, the app speaks %d", *head.Protocol, protocol.Version))
		return nil, fmt.Errorf("the runner speaks protocol %d and this app speaks %d: run an RTE release that speaks protocol %d, or upgrade the app", *head.Protocol, protocol.Version, protocol.Version)
	}
	m, err := protocol.Decode(data)
	if err != nil {
		var de *protocol.DecodeError
		if errors.As(err, &de) {
			if b, eerr := protocol.Encode(de.Reply()); eerr == nil {
				_ = ws.WriteMessage(websocket.TextMessage, b)
			}
		}
		closeWS(ws, protocol.CloseProtocolError, "bad hello")
		return nil, fmt.Errorf("bad hello: %w", err)
	}
	h, ok := m.(*protocol.Hello)
	if !ok {
		closeWS(ws, protocol.CloseProtocolError, "hello expected")
		return nil, fmt.Errorf("the runner's first message is %s, not hello", m.Type())
	}
	return h, nil
}

// ackedFor returns, for each job the runner has spooled, the highest seq the app has stored
// with every seq before it, so the runner resends only what is missing. Jobs the app does not
// know, or gave to another runner, are left out: their records are refused when they come.
func (a *App) ackedFor(ctx context.Context, runner string, spooled []protocol.SpooledJob) (map[string]int64, error) {
	var acked map[string]int64
	for _, s := range spooled {
		j, err := a.cfg.Store.GetJob(ctx, s.Job)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read stored records of job %q for the welcome: %w", s.Job, err)
		}
		if j.Runner != runner || j.LastSeq == 0 {
			continue
		}
		if acked == nil {
			acked = map[string]int64{}
		}
		acked[s.Job] = j.LastSeq
	}
	return acked, nil
}

// closeWS ends a socket that was never handed to a socket.Conn: a close frame saying why, then
// the connection.
func closeWS(ws *websocket.Conn, code int, reason string) {
	_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
	_ = ws.Close()
}

// fromRTE lists the messages an RTE may send after the handshake. Anything else valid is
// answered with an unexpected error, so the caller only ever sees messages it must handle.
var fromRTE = map[string]bool{
	protocol.TypeJobAccepted:  true,
	protocol.TypeJobRefused:   true,
	protocol.TypeBundleWant:   true,
	protocol.TypeBundleRanges: true,
	protocol.TypeRecord:       true,
	protocol.TypeCapacity:     true,
	protocol.TypeCheckResult:  true,
	protocol.TypeError:        true,
}

// Peer is one connected runner after a successful handshake.
type Peer struct {
	Runner string         // the runner's name at the app
	Hello  protocol.Hello // what the runner said it is and holds
	// Welcome is what the app answered: the runner page's max_jobs and the acked seq of each
	// spooled job the app knows.
	Welcome protocol.Welcome
	Conn    *socket.Conn // Send and Close are safe for concurrent use; only Next reads
}

// Run writes the peer's outgoing frames and keepalive pings until the socket ends or ctx is
// done, which closes it. It blocks; call it once, from the goroutine that owns the peer.
func (p *Peer) Run(ctx context.Context) error { return p.Conn.Run(ctx) }

// Next returns the next valid message from the runner. A bad one (not JSON, unknown type,
// missing field, or a message only the app sends) is answered with an error message and
// skipped; too many bad ones close the socket with 1008. Next must be called from one goroutine.
// It blocks until a message arrives or the socket ends; cancelling ctx ends the socket too,
// because a blocked WebSocket read cannot be abandoned any other way.
func (p *Peer) Next(ctx context.Context) (protocol.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		p.Conn.Close(websocket.CloseGoingAway, "app stopped reading")
	})
	defer func() {
		if !stop() {
			<-fired
		}
	}()
	for {
		kind, data, err := p.Conn.Read()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("runner %q: %w", p.Runner, err)
		}
		var reply protocol.Error
		var m protocol.Message
		switch {
		case kind != websocket.TextMessage:
			reply = protocol.Error{Code: protocol.ErrUnexpected, Message: "an RTE sends the app no binary frames"}
		default:
			m, err = protocol.Decode(data)
			var de *protocol.DecodeError
			switch {
			case errors.As(err, &de):
				reply = de.Reply()
			case err != nil:
				reply = protocol.Error{Code: protocol.ErrInvalid, Message: protocol.PeerText(err.Error(), 300)}
			case !fromRTE[m.Type()]:
				reply = protocol.Error{Code: protocol.ErrUnexpected, Message: fmt.Sprintf("%s is not a message an RTE sends after the handshake", m.Type())}
			default:
				return m, nil
			}
		}
		if err := p.Conn.ReportBad(ctx, reply); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("runner %q: %w", p.Runner, err)
		}
	}
}

// Send queues m for the runner. It returns once queued, not once written.
func (p *Peer) Send(ctx context.Context, m protocol.Message) error { return p.Conn.Send(ctx, m) }
