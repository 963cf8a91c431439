package pinning

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
)

// Registration states reported through Registrar.OnState.
const (
	StateRegistering = "registering"
	StatePending     = protocol.StatePending
	StateApproved    = protocol.StateApproved
	StateRefused     = "refused"
	StateUnreachable = "unreachable"
)

// Defaults of the registration call.
const (
	// maxAnswerBytes bounds how much of the app's answer is read: a real answer is a few hundred
	// bytes, and a misconfigured APP_URL may point at something that streams megabytes.
	maxAnswerBytes = 64 << 10
	// maxPeerText bounds text from the app before it goes into a log or an error.
	maxPeerText = 300
	// defaultAttemptTimeout bounds one POST, so a peer that accepts and never answers counts as
	// no answer instead of holding the registration forever.
	defaultAttemptTimeout = 30 * time.Second
	// defaultFailureLogEvery is how often a run of failures is logged after its first one.
	defaultFailureLogEvery = 5 * time.Minute
)

// RefusedError is a 4xx (or a redirect) answer to registration. Retrying does not help: the
// operator or an admin must act, and the message says what the app said.
type RefusedError struct {
	Status  int    // HTTP status of the answer
	Message string // the app's error text, clipped
}

func (e *RefusedError) Error() string {
	msg := fmt.Sprintf("app refused registration with %d %s", e.Status, http.StatusText(e.Status))
	if e.Message != "" {
		msg += ": " + e.Message
	}
	if e.Status == http.StatusConflict {
		msg += " (the certificate differs from the one approved for this runner: an admin must approve the new certificate, or restore the old certificate and key)"
	}
	return msg
}

// Registrar makes the registration call of an inbound RTE (PROTOCOL.md section 2). Its fields are
// read by Run and must not change while Run is running.
type Registrar struct {
	Client  *http.Client // built by the caller (proxy, CA roots, APP_TLS_VERIFY); redirects are never followed
	AppURL  string       // the app's base URL; the call goes to AppURL + protocol.RegisterPath
	Request protocol.RegisterRequest
	Logger  *zap.Logger // nil logs nothing

	MinBackoff, MaxBackoff time.Duration // retry waits; 1 s and 60 s when zero
	AttemptTimeout         time.Duration // one POST; 30 s when zero
	FailureLogEvery        time.Duration // repeat a run of failures in the log at most this often; 5 min when zero

	OnState func(state string) // optional; called with the State* constants as they change, from Run's goroutine
}

// answer is what one registration attempt came to.
type answer struct {
	state  string // StateApproved, StatePending, StateRefused, or StateUnreachable to retry
	resp   protocol.RegisterResponse
	status int
	cause  string // for StateUnreachable and StateRefused: why, bounded
}

// Run makes the registration call and follows the answer table: 201 approved and 202 pending are
// logged and return nil; a 4xx (or a redirect, which would send the token elsewhere) returns a
// *RefusedError without retrying; a 5xx or no answer is retried with jittered exponential backoff
// until one of those or until ctx is done, when it returns ctx's error.
//
// Run blocks and starts no goroutine. It never logs the token: only its short fingerprint.
func (r *Registrar) Run(ctx context.Context) error {
	endpoint, shown, err := r.endpoint()
	if err != nil {
		return err
	}
	if r.Request.Token == "" {
		return errors.New("register with app: the request has no token (RTE_TOKEN)")
	}
	body, err := json.Marshal(r.Request)
	if err != nil {
		return fmt.Errorf("register with app: encode request: %w", err)
	}
	log := r.Logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("app_register_url", shown), zap.String("name", r.Request.Name))
	client := r.client()
	ownToken := protocol.TokenFingerprint(r.Request.Token)
	ownCert := certificateFingerprintOfPEM(r.Request.Certificate)
	logEvery := r.FailureLogEvery
	if logEvery <= 0 {
		logEvery = defaultFailureLogEvery
	}
	backoff := Backoff{Min: r.MinBackoff, Max: r.MaxBackoff}

	state := ""
	setState := func(s string) {
		if s != state && r.OnState != nil {
			r.OnState(s)
		}
		state = s
	}
	setState(StateRegistering)
	log.Info("registering with app",
		zap.String("url", r.Request.URL),
		zap.String("token_fingerprint", ownToken),
		zap.String("certificate_fingerprint", ownCert))

	var failures int
	var lastLogged time.Time
	for {
		a, err := r.attempt(ctx, client, endpoint, body)
		if err != nil {
			return err
		}
		if a.state == StateUnreachable {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			failures++
			setState(StateUnreachable)
			wait := backoff.Next()
			if failures == 1 || time.Since(lastLogged) >= logEvery {
				lastLogged = time.Now()
				log.Warn("app not reachable for registration, retrying",
					zap.String("cause", a.cause),
					zap.Int("attempts", failures),
					zap.Duration("next_attempt_in", wait))
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			continue
		}
		if failures > 0 {
			log.Info("app reachable again", zap.Int("failed_attempts", failures))
		}
		setState(a.state)
		switch a.state {
		case StateApproved:
			log.Info("registration approved; waiting for the app to dial", zap.Int("status", a.status))
			return nil
		case StatePending:
			r.logPending(log, a.resp, ownToken, ownCert)
			return nil
		default:
			err := &RefusedError{Status: a.status, Message: a.cause}
			log.Error("registration refused; the RTE keeps serving but the app will not dial it until this is fixed",
				zap.Int("status", a.status), zap.String("app_error", a.cause))
			return err
		}
	}
}

// endpoint returns the registration URL, and the same URL with any password replaced for logs.
func (r *Registrar) endpoint() (string, string, error) {
	u, err := url.Parse(r.AppURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		shown := "(unparsable)"
		if u != nil {
			shown = u.Redacted()
		}
		return "", "", fmt.Errorf("register with app: APP_URL %q is not an http:// or https:// URL", protocol.PeerText(shown, maxPeerText))
	}
	u.Path = strings.TrimRight(u.Path, "/") + protocol.RegisterPath
	u.RawPath = ""
	u.RawQuery, u.Fragment = "", ""
	return u.String(), u.Redacted(), nil
}

// client returns a copy of the caller's client that does not follow redirects: a redirect would
// replay a body holding the token to an address nobody configured.
func (r *Registrar) client() *http.Client {
	c := &http.Client{}
	if r.Client != nil {
		*c = *r.Client
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}

func (r *Registrar) attempt(ctx context.Context, client *http.Client, endpoint string, body []byte) (answer, error) {
	timeout := r.AttemptTimeout
	if timeout <= 0 {
		timeout = defaultAttemptTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return answer{}, fmt.Errorf("register with app: build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if r.Request.Version != "" {
		req.Header.Set("User-Agent", "rte/"+r.Request.Version)
	}
	resp, err := client.Do(req)
	if err != nil {
		// The error may carry a peer's text (a TLS alert, a proxy's answer), hence the clip.
		return answer{state: StateUnreachable, cause: peerText(err.Error(), r.redact)}, nil
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil && resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// A 2xx whose body broke off is still a 2xx; the fingerprints may just be missing.
		data = nil
	}
	a := interpret(resp.StatusCode, data, r.redact)
	if a.state == StateRefused && resp.StatusCode >= 300 && resp.StatusCode < 400 {
		a.cause = fmt.Sprintf("redirected to %s: set APP_URL to the app's final address", peerText(resp.Header.Get("Location"), r.redact))
	}
	return a, nil
}

// redact removes the tokens from text the app sent back: an app that echoes the request in an
// error message must not put the token into the RTE's log.
func (r *Registrar) redact(s string) string {
	for _, secret := range []string{r.Request.Token, r.Request.JoinToken} {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	return s
}

// interpret maps an answer to the registration table of PROTOCOL.md section 2. Every string
// taken from the answer goes through peerText; the decoded strings are redacted as well as the
// raw body, since JSON escapes could hide a token from a byte search.
func interpret(status int, body []byte, redact func(string) string) answer {
	a := answer{status: status}
	decodeErr := json.Unmarshal(body, &a.resp)
	switch {
	case status >= 200 && status < 300:
		a.state = StateApproved
		if status == http.StatusAccepted || a.resp.State == protocol.StatePending {
			a.state = StatePending
		}
	case status == http.StatusRequestTimeout:
		// 408 says the app gave up waiting for our request: a network matter, not a refusal.
		a.state = StateUnreachable
		a.cause = fmt.Sprintf("app answered %d %s", status, http.StatusText(status))
	case status >= 300 && status < 500:
		a.state = StateRefused
		switch {
		case decodeErr == nil && a.resp.Error != "":
			a.cause = peerText(a.resp.Error, redact)
		default:
			a.cause = peerText(string(body), redact)
		}
	default:
		a.state = StateUnreachable
		a.cause = fmt.Sprintf("app answered %d %s", status, http.StatusText(status))
		if decodeErr == nil && a.resp.Error != "" {
			a.cause += ": " + peerText(a.resp.Error, redact)
		}
	}
	a.resp.Error = peerText(a.resp.Error, redact)
	a.resp.State = peerText(a.resp.State, redact)
	a.resp.TokenFingerprint = peerText(a.resp.TokenFingerprint, redact)
	a.resp.CertificateFingerprint = peerText(a.resp.CertificateFingerprint, redact)
	return a
}

// peerText makes text from the app fit for a log line or an error: bounded, on one line, and
// without our tokens. Redacting before the clip keeps a cut from leaving a token's prefix;
// redacting after it catches a token that the clip's character replacements formed.
func peerText(s string, redact func(string) string) string {
	return redact(protocol.PeerText(redact(s), maxPeerText))
}

func (r *Registrar) logPending(log *zap.Logger, resp protocol.RegisterResponse, ownToken, ownCert string) {
	log.Info("registration pending: an admin must approve this runner in the app after comparing the fingerprints with the ones this RTE logged at start",
		zap.String("app_token_fingerprint", resp.TokenFingerprint),
		zap.String("app_certificate_fingerprint", resp.CertificateFingerprint))
	if resp.TokenFingerprint == "" {
		log.Warn("the app's pending answer carries no token fingerprint: the admin cannot check that the app received this RTE's token")
	} else if resp.TokenFingerprint != ownToken {
		log.Warn("the app received a different token than this RTE sent (someone else's token, or a proxy in between): do not approve this request",
			zap.String("token_fingerprint", ownToken),
			zap.String("app_token_fingerprint", resp.TokenFingerprint))
	}
	if ownCert != "" && resp.CertificateFingerprint != "" && resp.CertificateFingerprint != ownCert {
		log.Warn("the app received a different certificate than this RTE sent (a proxy in between?): do not approve this request",
			zap.String("certificate_fingerprint", ownCert),
			zap.String("app_certificate_fingerprint", resp.CertificateFingerprint))
	}
}

// certificateFingerprintOfPEM is the short fingerprint of the first certificate in pemText, or ""
// when there is none (an http:// RTE registers without a certificate).
func certificateFingerprintOfPEM(pemText string) string {
	chain, err := certificateBlocks([]byte(pemText))
	if err != nil {
		return ""
	}
	return protocol.CertificateFingerprint(chain[0])
}
