package session

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"

	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/socket"
)

// Defaults of Dialer.
const (
	// DefaultMinBackoff and DefaultMaxBackoff bound the jittered wait between dials
	// (PROTOCOL.md section 1).
	DefaultMinBackoff = time.Second
	DefaultMaxBackoff = 30 * time.Second
	// DefaultRejectedBackoff is the wait after the app rejected or refused the runner (403, or
	// a close with 4003). Only a person can change that answer, so asking every 30 s would only
	// load the app and fill both logs.
	DefaultRejectedBackoff = 5 * time.Minute
	// DefaultDialTimeout bounds the TCP connect, the proxy's CONNECT, the TLS handshake and the
	// upgrade together.
	DefaultDialTimeout = 20 * time.Second
	// DefaultFailureLogEvery is how often a run of failed dials is logged again after its first
	// line: an app that is down for an hour costs a dozen lines, not 120.
	DefaultFailureLogEvery = 5 * time.Minute
)

// maxAnswerText bounds the app's refusal text before it goes into a log.
const maxAnswerText = 300

// Dialer keeps an outbound RTE's one socket to the app (PROTOCOL.md section 1): it dials
// APP_URL's outbound socket path, hands each socket to a Manager, and dials again with
// jittered backoff when the socket ends or the dial fails. Set the fields, then call Run once.
type Dialer struct {
	// AppURL is APP_URL: http:// or https://, a host, optionally a port and a path prefix. The
	// socket is protocol.OutboundSocketPath below it, over ws:// or wss:// (see OutboundURL).
	AppURL    string
	Token     string // RTE_TOKEN, sent as Authorization: Bearer
	Name      string // RTE_NAME, sent as X-RTE-Name
	JoinToken string // RTE_JOIN_TOKEN, sent as X-RTE-Join-Token when not empty

	// TLS verifies the app's certificate; nil uses the system roots. internal/rte adds
	// NODE_EXTRA_CA_CERTS, or turns verification off for APP_TLS_VERIFY=0.
	TLS *tls.Config
	// Proxy picks the proxy for the socket (HTTPS_PROXY, NO_PROXY); nil dials directly. An
	// http:// proxy is asked with CONNECT, a socks5:// one through SOCKS.
	Proxy func(*http.Request) (*url.URL, error)

	Logger *zap.Logger // named "dialer" here; nil logs nothing

	MinBackoff      time.Duration // DefaultMinBackoff when zero
	MaxBackoff      time.Duration // DefaultMaxBackoff when zero
	RejectedBackoff time.Duration // DefaultRejectedBackoff when zero
	DialTimeout     time.Duration // DefaultDialTimeout when zero
	FailureLogEvery time.Duration // DefaultFailureLogEvery when zero
}

// OutboundURL turns APP_URL into the outbound socket's URL: wss:// for https://, ws:// for
// http://, with protocol.OutboundSocketPath after any path prefix.
func OutboundURL(appURL string) (string, error) {
	u, err := url.Parse(appURL)
	if err != nil || u.Host == "" || u.Hostname() == "" {
		return "", fmt.Errorf("APP_URL %q is not an absolute http:// or https:// URL with a host", protocol.PeerText(appURL, 200))
	}
	switch strings.ToLower(u.Scheme) {
	case "https":
		u.Scheme = "wss"
	case "http":
		u.Scheme = "ws"
	default:
		return "", fmt.Errorf("APP_URL %q: scheme %q is not https or http", protocol.PeerText(appURL, 200), protocol.PeerText(u.Scheme, 20))
	}
	if u.User != nil {
		return "", fmt.Errorf("APP_URL %s carries credentials: remove them, RTE_TOKEN is the runner's credential", u.Redacted())
	}
	u.Path = strings.TrimRight(u.Path, "/") + protocol.OutboundSocketPath
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	return u.String(), nil
}

// Run dials the app and serves each socket on m until ctx is done; it returns nil then, once
// the socket is closed. It returns an error at once only for a Dialer that cannot work (no
// token, no name, a bad AppURL).
//
// Between dials it waits with jittered exponential backoff from MinBackoff up to MaxBackoff,
// starting again from MinBackoff after a socket the app welcomed. A token the app refuses (401)
// is tried again every MaxBackoff; a runner the app refuses (403) or rejects (close 4003) every
// RejectedBackoff. A run of failures is logged when it starts and when its cause changes, then
// every FailureLogEvery, and once more when the app welcomes a socket again.
func (d *Dialer) Run(ctx context.Context, m *Manager) error {
	target, err := OutboundURL(d.AppURL)
	if err != nil {
		return fmt.Errorf("outbound dialer: %w", err)
	}
	switch {
	case len(d.Token) < protocol.MinTokenLength:
		return fmt.Errorf("outbound dialer: the token is %d characters, at least %d are required (RTE_TOKEN)", len(d.Token), protocol.MinTokenLength)
	case d.Name == "":
		return errors.New("outbound dialer: no runner name (RTE_NAME)")
	}
	c := d.withDefaults()
	log := c.Logger.Named("dialer").With(zap.String("app_socket", target))
	via := c.proxyFor(target)
	if via != "" {
		log = log.With(zap.String("proxy", via))
	}
	ws := &websocket.Dialer{
		Proxy:            c.Proxy,
		TLSClientConfig:  c.TLS,
		HandshakeTimeout: c.DialTimeout,
		Subprotocols:     []string{protocol.Subprotocol},
	}
	header := http.Header{}
	header.Set("Authorization", "Bearer "+c.Token)
	header.Set(protocol.HeaderRTEName, c.Name)
	if c.JoinToken != "" {
		header.Set(protocol.HeaderJoinToken, c.JoinToken)
	}
	log.Info("dialling the app", zap.Bool("join_token", c.JoinToken != ""))

	backoff := pinning.Backoff{Min: c.MinBackoff, Max: c.MaxBackoff}
	down := outage{log: log, every: c.FailureLogEvery}
	for {
		conn, resp, err := ws.DialContext(ctx, target, header)
		if ctx.Err() != nil {
			if conn != nil {
				_ = conn.Close()
			}
			return nil
		}
		var wait time.Duration
		if err != nil {
			f := c.explainDial(resp, err, via)
			wait = f.wait(c, &backoff)
			down.failed(f, wait)
		} else {
			// The outage ends with the welcome, which is when it is logged; the socket may
			// then stay up for days.
			welcomed, serr := m.serveDialled(ctx, conn, down.recovered)
			if ctx.Err() != nil {
				return nil
			}
			if welcomed {
				backoff.Reset()
				down.recovered()
			}
			wait = c.afterSocket(log, &down, &backoff, welcomed, serr)
		}
		if !sleep(ctx, wait) {
			return nil
		}
	}
}

func (d *Dialer) withDefaults() Dialer {
	c := *d
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.TLS == nil {
		c.TLS = &tls.Config{}
	} else {
		c.TLS = c.TLS.Clone()
	}
	if c.TLS.MinVersion == 0 {
		c.TLS.MinVersion = tls.VersionTLS12
	}
	for _, v := range []struct {
		d   *time.Duration
		def time.Duration
	}{
		{&c.MinBackoff, DefaultMinBackoff}, {&c.MaxBackoff, DefaultMaxBackoff},
		{&c.RejectedBackoff, DefaultRejectedBackoff}, {&c.DialTimeout, DefaultDialTimeout},
		{&c.FailureLogEvery, DefaultFailureLogEvery},
	} {
		if *v.d <= 0 {
			*v.d = v.def
		}
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = c.MinBackoff
	}
	return c
}

// proxyFor names the proxy the socket goes through (host:port, never its credentials), or "".
func (d *Dialer) proxyFor(target string) string {
	if d.Proxy == nil {
		return ""
	}
	u, err := url.Parse(target)
	if err != nil {
		return ""
	}
	// The proxy function sees the URL as gorilla hands it over: http(s), not ws(s).
	u.Scheme = strings.Replace(u.Scheme, "ws", "http", 1)
	p, err := d.Proxy(&http.Request{Method: http.MethodGet, URL: u, Host: u.Host, Header: http.Header{}})
	if err != nil || p == nil {
		return ""
	}
	return p.Scheme + "://" + p.Host
}

// failure is one failed dial, explained for the operator.
type failure struct {
	kind string // groups failures of one cause: a new kind is logged at once
	msg  string // the log message: what happened and what to do
	err  error
	// pace picks the wait: paceBackoff (the growing backoff), paceMax or paceRejected.
	pace int
}

const (
	paceBackoff = iota
	paceMax
	paceRejected
)

func (f failure) wait(c Dialer, b *pinning.Backoff) time.Duration {
	switch f.pace {
	case paceMax:
		return c.MaxBackoff
	case paceRejected:
		return c.RejectedBackoff
	}
	return b.Next()
}

// explainDial turns a failed dial into what the operator reads: the app's answer when it gave
// one, else the network, proxy or TLS error with the setting that fixes it.
func (d *Dialer) explainDial(resp *http.Response, err error, via string) failure {
	if resp != nil && errors.Is(err, websocket.ErrBadHandshake) {
		text := d.answerText(resp)
		cause := fmt.Errorf("the app answered %d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
		if text != "" {
			cause = fmt.Errorf("%w: %s", cause, text)
		}
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			return failure{kind: "token_refused", err: cause, pace: paceMax,
				msg: "the app refused this runner's token: check that RTE_TOKEN and RTE_NAME are the ones the app holds for this runner, or have an admin remove the runner at the app so this RTE can join anew"}
		case http.StatusForbidden:
			return failure{kind: "refused", err: cause, pace: paceRejected,
				msg: "the app refused this runner; dialling again only after the rejected backoff: fix what the app's answer names (RTE_JOIN_TOKEN, RTE_MODE), or have an admin approve the runner"}
		case http.StatusNotFound:
			return failure{kind: "not_found", err: cause,
				msg: "the app has no outbound socket at this address: check APP_URL (the app's base address) and that the app serves RTEs in outbound mode"}
		case http.StatusTooManyRequests:
			return failure{kind: "too_many_waiting", err: cause, pace: paceMax,
				msg: "the app holds too many runners waiting for approval: an admin must approve or reject them at the app"}
		case http.StatusSwitchingProtocols:
			return failure{kind: "bad_upgrade", err: cause,
				msg: "the answer to the upgrade is not a WebSocket one: check that APP_URL reaches the app and no proxy in between strips the upgrade headers"}
		}
		return failure{kind: fmt.Sprintf("status_%d", resp.StatusCode), err: cause,
			msg: "the app did not take the socket; dialling again with backoff"}
	}
	if via != "" {
		err = fmt.Errorf("through proxy %s: %w", via, err)
	}
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		notTLS    tls.RecordHeaderError
		netErr    net.Error
	)
	switch {
	case errors.As(err, &unknownCA):
		return failure{kind: "tls_unknown_authority", err: err,
			msg: "the app's certificate is not signed by a CA this RTE trusts: set NODE_EXTRA_CA_CERTS to a PEM file of the CA that signed it"}
	case errors.As(err, &hostname):
		return failure{kind: "tls_hostname", err: err,
			msg: "the app's certificate does not name the host in APP_URL: use the name the certificate was issued for in APP_URL"}
	case errors.As(err, &invalid):
		return failure{kind: "tls_invalid", err: err,
			msg: "the app's certificate is not valid (expired, not yet valid, or not for a server): renew it at the app"}
	case errors.As(err, &notTLS):
		return failure{kind: "tls_not_tls", err: err,
			msg: "the app does not speak TLS at this address: use http:// in APP_URL, or the app's TLS port"}
	case errors.As(err, &netErr) && netErr.Timeout():
		return failure{kind: "timeout", err: err,
			msg: "the app did not answer in time; dialling again with backoff: check that APP_URL is right and no firewall drops the traffic"}
	}
	return failure{kind: "unreachable", err: err,
		msg: "cannot reach the app; dialling again with backoff: check APP_URL, HTTPS_PROXY and NO_PROXY, and that the app runs"}
}

// answerText reads the app's refusal: the "error" of a JSON body, else the body as text,
// bounded, on one line, and without this RTE's secrets should the answer echo them.
func (d *Dialer) answerText(resp *http.Response) string {
	if resp.Body == nil {
		return ""
	}
	// gorilla keeps at most 1 KiB of a refused upgrade's body; the limit is for other callers.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	var answer struct {
		Error string `json:"error"`
	}
	text := string(body)
	if json.Unmarshal(body, &answer) == nil && answer.Error != "" {
		text = answer.Error
	}
	for _, secret := range []string{d.Token, d.JoinToken} {
		if secret != "" {
			text = strings.ReplaceAll(text, secret, "[redacted]")
		}
	}
	return strings.TrimSpace(protocol.PeerText(text, maxAnswerText))
}

// afterSocket logs why a served socket ended, when the session has not said it already, and
// returns the wait before the next dial.
func (d *Dialer) afterSocket(log *zap.Logger, down *outage, b *pinning.Backoff, welcomed bool, err error) time.Duration {
	reason := ""
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		reason = protocol.PeerText(ce.Text, maxPeerText)
	}
	switch socket.CloseCode(err) {
	case protocol.CloseRejected:
		wait := d.RejectedBackoff
		log.Warn("the app rejected this runner and removed it; this RTE joins again as a new request after the rejected backoff: stop it, or have an admin approve it then",
			zap.String("reason", reason), zap.Duration("retry_in", wait))
		return wait
	case protocol.CloseReplaced:
		// Another socket with this runner's name and token took this one's place: two RTEs
		// share RTE_NAME and RTE_TOKEN and would push each other out forever at the
		// shortest wait, so the backoff keeps growing.
		wait := b.Next()
		log.Warn("the app replaced this socket with a newer one of the same runner: give each RTE its own RTE_NAME and RTE_TOKEN",
			zap.Duration("retry_in", wait))
		return wait
	}
	wait := b.Next()
	if !welcomed {
		down.failed(failure{kind: "no_welcome", err: err,
			msg: "the app took the socket but closed it before its welcome; dialling again with backoff"}, wait)
		return wait
	}
	// The session logged the close and its cause.
	log.Info("dialling the app again", zap.Duration("retry_in", wait))
	return wait
}

// outage logs a run of failed dials: its first failure, each change of cause, then one line
// every `every`; the rest go to debug. It is used by Run's goroutine and, for recovered, by the
// goroutine that sees the welcome, so it locks.
type outage struct {
	log   *zap.Logger
	every time.Duration

	mu       sync.Mutex
	failures int
	since    time.Time
	kind     string
	logged   time.Time
}

func (o *outage) failed(f failure, wait time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	o.failures++
	if o.failures == 1 {
		o.since = now
	}
	fields := []zap.Field{zap.Error(f.err), zap.Duration("retry_in", wait),
		zap.Int("failed_attempts", o.failures), zap.Duration("failing_for", now.Sub(o.since).Round(time.Second))}
	if o.failures > 1 && f.kind == o.kind && now.Sub(o.logged) < o.every {
		o.log.Debug(f.msg, fields...)
		return
	}
	o.kind, o.logged = f.kind, now
	o.log.Warn(f.msg, fields...)
}

func (o *outage) recovered() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failures == 0 {
		return
	}
	o.log.Info("the app is reachable again", zap.Int("failed_attempts", o.failures),
		zap.Duration("unreachable_for", time.Since(o.since).Round(time.Millisecond)))
	o.failures, o.kind = 0, ""
}

// serveDialled is Serve for the Dialer: it also reports whether the app welcomed the socket,
// and calls onWelcome (when not nil) as soon as the welcome arrives, from a goroutine it waits
// for before returning.
func (m *Manager) serveDialled(ctx context.Context, ws *websocket.Conn, onWelcome func()) (welcomed bool, err error) {
	var (
		wg   sync.WaitGroup
		sess *session
	)
	err = m.serve(ctx, incoming{ws: ws, remote: ws.RemoteAddr().String()}, dirOutbound, func(s *session) {
		sess = s
		if onWelcome == nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-s.welcomed:
				onWelcome()
			case <-s.conn.Done():
			}
		}()
	})
	wg.Wait()
	if sess != nil {
		welcomed = sess.isWelcomed.Load()
	}
	if ctx.Err() != nil {
		return welcomed, nil
	}
	return welcomed, err
}

// sleep waits d or until ctx is done, and reports whether it waited the whole time.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
