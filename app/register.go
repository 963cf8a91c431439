package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"

	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
)

// maxRegisterBody bounds a registration body. A real one is a few KiB (mostly the certificate
// PEM); anything near the bound is not an RTE.
const maxRegisterBody = 1 << 20

// registration is a checked registration request.
type registration struct {
	name, url, token, joinToken, version string
	der                                  []byte // the leaf certificate; nil for an http:// runner
}

// answer is the outcome of one registration: the HTTP status and its JSON body.
type answer struct {
	status int
	body   protocol.RegisterResponse
}

func refused(status int, format string, args ...any) answer {
	return answer{status: status, body: protocol.RegisterResponse{Error: fmt.Sprintf(format, args...)}}
}

func (a *App) serveRegister(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeAnswer(w, refused(http.StatusMethodNotAllowed, "registration is POST %s with a JSON body", protocol.RegisterPath))
		return
	}
	log := a.log.With(zap.String("remote_addr", req.RemoteAddr))
	reg, bad := decodeRegistration(w, req)
	if bad != nil {
		log.Warn("registration refused: bad request", zap.Int("status", bad.status), zap.String("error", bad.body.Error))
		writeAnswer(w, *bad)
		return
	}
	tokenFP := protocol.TokenFingerprint(reg.token)
	certFP := fingerprintOrEmpty(reg.der)
	log = log.With(
		zap.String("name", reg.name),
		zap.String("url", reg.url),
		zap.String("token_fingerprint", tokenFP),
		zap.String("certificate_fingerprint", certFP),
		zap.String("version", reg.version),
		zap.Bool("join_token", reg.joinToken != ""))

	ans, err := a.register(req.Context(), reg, req.RemoteAddr)
	if err != nil {
		// A store failure: 5xx makes the RTE retry with backoff, which is what a passing
		// database problem needs.
		log.Error("registration failed", zap.Error(err))
		writeAnswer(w, refused(http.StatusInternalServerError, "the app could not store the registration; the RTE retries"))
		return
	}
	switch ans.status {
	case http.StatusCreated:
		log.Info("registration approved", zap.Int("status", ans.status))
	case http.StatusAccepted:
		log.Info("registration waiting for an admin to approve it after comparing fingerprints with the RTE's log", zap.Int("status", ans.status))
	default:
		log.Warn("registration refused", zap.Int("status", ans.status), zap.String("error", ans.body.Error))
	}
	if ans.status == http.StatusCreated || ans.status == http.StatusAccepted {
		ans.body.TokenFingerprint = tokenFP
		ans.body.CertificateFingerprint = certFP
	}
	writeAnswer(w, ans)
}

// decodeRegistration reads and checks the body; a non-nil answer is the refusal to send.
func decodeRegistration(w http.ResponseWriter, req *http.Request) (registration, *answer) {
	fail := func(status int, format string, args ...any) (registration, *answer) {
		ans := refused(status, format, args...)
		return registration{}, &ans
	}
	var body protocol.RegisterRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, req.Body, maxRegisterBody)).Decode(&body); err != nil {
		var tooLarge *http.MaxBytesError
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &tooLarge):
			return fail(http.StatusRequestEntityTooLarge, "body is larger than %d bytes: a registration is a small JSON object", maxRegisterBody)
		case errors.As(err, &typeErr) && typeErr.Field != "":
			return fail(http.StatusBadRequest, "%s must be a JSON %s, not %s", typeErr.Field, typeErr.Type.Kind(), typeErr.Value)
		default:
			return fail(http.StatusBadRequest, "body is not a registration JSON object (%s)", protocol.PeerText(err.Error(), 200))
		}
	}
	if err := checkName(body.Name); err != nil {
		return fail(http.StatusBadRequest, "%s", err)
	}
	if err := checkRunnerURL(body.URL); err != nil {
		return fail(http.StatusBadRequest, "%s", err)
	}
	switch {
	case body.Token == "":
		return fail(http.StatusBadRequest, "token is required: the RTE sends its RTE_TOKEN")
	case len(body.Token) < protocol.MinTokenLength:
		return fail(http.StatusBadRequest, "token is %d characters, at least %d are required: set a longer RTE_TOKEN", len(body.Token), protocol.MinTokenLength)
	case strings.IndexFunc(body.Token, unicode.IsControl) >= 0:
		// The app sends the token in an Authorization header, which cannot carry these.
		return fail(http.StatusBadRequest, "token holds control characters: set an RTE_TOKEN of printable characters")
	}
	reg := registration{
		name:      body.Name,
		url:       body.URL,
		token:     body.Token,
		joinToken: body.JoinToken,
		version:   protocol.PeerText(body.Version, 64),
	}
	if isHTTPS(body.URL) {
		if body.Certificate == "" {
			return fail(http.StatusBadRequest, "url %s is https:// but no certificate was sent: the RTE sends the certificate it listens with (HTTPS=1)", body.URL)
		}
		der, err := parseCertificatePEM(body.Certificate)
		if err != nil {
			return fail(http.StatusBadRequest, "certificate: %s", err)
		}
		reg.der = der
	} else if body.Certificate != "" {
		return fail(http.StatusBadRequest, "url %s is http:// but a certificate was sent: an RTE listening with HTTPS=1 needs an https:// RTE_URL", body.URL)
	}
	return reg, nil
}

// parseCertificatePEM returns the DER of the first CERTIFICATE block: the leaf, which is what
// the RTE presents first in its handshake and what the app pins.
func parseCertificatePEM(text string) ([]byte, error) {
	rest := []byte(text)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("no PEM CERTIFICATE block found: send the certificate as PEM (-----BEGIN CERTIFICATE-----)")
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return nil, fmt.Errorf("the CERTIFICATE block does not parse: %s", protocol.PeerText(err.Error(), 200))
		}
		return block.Bytes, nil
	}
}

// register applies one checked registration to the store and decides the answer
// (PROTOCOL.md section 2). Only a store failure is an error.
func (a *App) register(ctx context.Context, reg registration, remoteAddr string) (answer, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	runners, err := a.pruneLocked(ctx)
	if err != nil {
		return answer{}, err
	}
	// A wrong join token is refused before anything else, so an RTE with a stale one learns it
	// at once instead of waiting for an admin who was never told.
	joined := false
	if reg.joinToken != "" {
		if a.cfg.JoinToken == "" {
			return refused(http.StatusForbidden, "this app accepts no join token: remove RTE_JOIN_TOKEN, and an admin approves the runner instead"), nil
		}
		if !equalSecret(reg.joinToken, a.cfg.JoinToken) {
			return refused(http.StatusForbidden, "join_token is not the app's join token: set RTE_JOIN_TOKEN to the app's current join token, or remove it and have an admin approve the runner"), nil
		}
		joined = true
	}
	var r *Runner
	for _, x := range runners {
		if x.Name == reg.name {
			r = x
		}
	}
	now := a.cfg.Now()
	put := func(r *Runner, ans answer) (answer, error) {
		if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
			return answer{}, fmt.Errorf("store runner %q: %w", r.Name, err)
		}
		return ans, nil
	}
	approved := answer{status: http.StatusCreated, body: protocol.RegisterResponse{State: protocol.StateApproved}}
	pending := answer{status: http.StatusAccepted, body: protocol.RegisterResponse{State: protocol.StatePending}}

	switch {
	case r == nil:
		if why := a.waitingFull(runners, remoteAddr); !joined && why != "" {
			return refused(http.StatusTooManyRequests, "%s; then restart the RTE", why), nil
		}
		r = &Runner{Name: reg.name, Mode: protocol.ModeInbound, State: StateWaiting}
		reg.applyTo(r, remoteAddr, now)
		if joined {
			r.State, r.Certificate, r.ApprovedAt = StateApproved, reg.der, now
			return put(r, approved)
		}
		r.PendingCertificate = reg.der
		return put(r, pending)

	case r.Mode != protocol.ModeInbound:
		return refused(http.StatusConflict, "the name %q belongs to an %s runner at the app: choose another RTE_NAME, or have an admin remove that runner", reg.name, r.Mode), nil

	case isRequest(r) && !equalSecret(reg.token, r.Token):
		// Only the caller that made a request may change it: otherwise anyone who reaches the
		// app could swap in a certificate of their own while the admin compares the old one
		// (a short fingerprint is 32 bits and can be ground to match). An RTE that lost its
		// token waits for the request to expire, or for an admin to reject or clear it.
		return refused(http.StatusConflict, "runner %q already has a registration request waiting, made with another token: restore the RTE's RTE_TOKEN, choose another RTE_NAME, or have an admin reject the waiting request (it is dropped by itself after %s)",
			reg.name, a.cfg.WaitingTTL), nil

	case isRequest(r):
		// The same RTE registering again (a restart) refreshes its request; the page compares
		// the full SHA-256 it showed the admin with the certificate waiting at approval, so a
		// changed certificate is shown, never approved unseen.
		reg.applyTo(r, remoteAddr, now)
		if joined {
			r.State, r.Certificate, r.PendingCertificate, r.ApprovedAt = StateApproved, reg.der, nil, now
			return put(r, approved)
		}
		r.PendingCertificate = reg.der
		return put(r, pending)
	}

	// An admin approved this name before. Only a caller holding the runner's token may change
	// anything: otherwise anyone who reaches the app could push an approved runner back to
	// waiting, or plant a token of their own for an admin to approve by mistake.
	if !equalSecret(reg.token, r.Token) {
		// The answer names no fingerprint: the caller holds no token of this runner, and the
		// approved one's fingerprint is the admin's to compare, not a stranger's to learn.
		return refused(http.StatusConflict, "the token is not the one approved for runner %q: restore the RTE's RTE_TOKEN (its fingerprint is in the RTE's log; compare it with the runner page), or have an admin remove the runner so it can register anew",
			reg.name), nil
	}
	// The join token approves first joins only: a changed certificate always needs an admin.
	switch {
	case joined && r.Certificate == nil && r.CertificateSHA256 == "" && reg.der != nil &&
		isHTTPS(r.URL) && isHTTPS(reg.url) && (r.State == StateApproved || r.State == StateWaiting):
		// Added by hand or seed without a fingerprint and never pinned: this is the runner's first
		// join, and an RTE holding both its token and the app's join token is as trusted as one
		// joining anew. Without this, a seeded runner (compose, Helm) whose certificate is made on
		// its first start would wait for an admin although the operator declared both secrets.
		// A dial that met the certificate first left it pending; it is replaced by this one.
		reg.applyTo(r, remoteAddr, now)
		r.State, r.Certificate, r.PendingCertificate = StateApproved, reg.der, nil
		return put(r, approved)

	case r.Certificate == nil && r.State == StateApproved && isHTTPS(r.URL) && reg.der != nil:
		// Added by hand or seed and never pinned: this registration is the first certificate
		// the app meets for it.
		reg.applyTo(r, remoteAddr, now)
		if r.CertificateSHA256 == "" {
			r.State, r.PendingCertificate = StateWaiting, reg.der
			return put(r, pending)
		}
		if protocol.CertificateSHA256(reg.der) == r.CertificateSHA256 {
			r.Certificate = reg.der
			return put(r, approved)
		}
		r.State, r.PendingCertificate = StateWaiting, reg.der
		if _, err := put(r, answer{}); err != nil {
			return answer{}, err
		}
		return refused(http.StatusConflict, "certificate %s (sha256 %s) is not the one configured for runner %q (sha256 %s): an admin must approve it in the app after comparing fingerprints with the RTE's log",
			fingerprintOrEmpty(reg.der), protocol.CertificateSHA256(reg.der), reg.name, r.CertificateSHA256), nil

	case bytes.Equal(r.Certificate, reg.der) && isHTTPS(r.URL) == isHTTPS(reg.url):
		// A restart re-registers; or the old certificate and key were restored while a change
		// waited, which needs no approval since it is the approved certificate.
		reg.applyTo(r, remoteAddr, now)
		r.State, r.PendingCertificate = StateApproved, nil
		return put(r, approved)

	case r.State == StateWaiting:
		// Still waiting for an admin after a change: keep the newest certificate on offer.
		reg.applyTo(r, remoteAddr, now)
		r.PendingCertificate = reg.der
		return put(r, pending)
	}
	old := describeCertificate(r.URL, r.Certificate)
	reg.applyTo(r, remoteAddr, now)
	r.State, r.PendingCertificate = StateWaiting, reg.der
	if _, err := put(r, answer{}); err != nil {
		return answer{}, err
	}
	return refused(http.StatusConflict, "the certificate of approved runner %q changed (approved %s, now %s): an admin must approve the new certificate in the app after comparing fingerprints with the RTE's log, or restore the RTE's old certificate and key",
		reg.name, old, describeCertificate(reg.url, reg.der)), nil
}

// applyTo copies what a registration may change onto r. The token is copied too: for an
// approved runner it was just checked to be equal.
func (reg registration) applyTo(r *Runner, remoteAddr string, now time.Time) {
	r.URL = reg.url
	r.Token = reg.token
	r.TokenFingerprint = protocol.TokenFingerprint(reg.token)
	r.Version = reg.version
	r.RemoteAddr = remoteAddr
	r.RequestedAt = now
}

// describeCertificate names what an admin compares: the certificate's fingerprints, or its
// absence when TLS was turned off.
func describeCertificate(url string, der []byte) string {
	if der == nil {
		return url + " without a certificate"
	}
	return "certificate " + protocol.CertificateFingerprint(der) + ", sha256 " + protocol.CertificateSHA256(der)
}

// equalSecret compares two secrets in constant time, so the answer's timing does not reveal
// how much of a guess was right.
func equalSecret(got, want string) bool {
	// Digests first: ConstantTimeCompare returns at once when the lengths differ, so on the
	// raw strings the answer's timing would tell a caller the length of a runner's token.
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

func writeAnswer(w http.ResponseWriter, ans answer) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(ans.status)
	_ = json.NewEncoder(w).Encode(ans.body)
}
