package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
)

// Approve pins the runner's pending certificate and approves it; an http:// runner is approved
// without one. An outbound runner that is connected hears {"type":"approved"} and takes jobs
// from then on, on the same socket. Approving a runner that is already approved with nothing
// pending does nothing. A request that waited longer than WaitingTTL is gone (ErrNotFound), even
// if a page still shows it.
func (a *App) Approve(ctx context.Context, name string) error {
	_, err := a.approve(ctx, name, Shown{})
	return err
}

// ErrCertificateChanged is why ApproveCertificate or ApproveShown approved nothing: the
// certificate waiting is not the one the admin was shown. The error is a *ChangedError.
var ErrCertificateChanged = errors.New("the certificate waiting is not the one that was compared")

// ApproveCertificate is Approve bound to what the admin compared: it approves only if the
// certificate waiting has exactly this full SHA-256 (64 hex digits, as the RTE logs
// certificate_sha256; colons and case are ignored). The check and the approval happen under
// one lock, so no registration can swap the certificate between them. A short fingerprint is
// 32 bits, which a certificate can be ground to match offline; the full SHA-256 cannot.
// Otherwise it returns a *ChangedError, wrapping ErrCertificateChanged, that names the
// certificate waiting now.
func (a *App) ApproveCertificate(ctx context.Context, name, certSHA256 string) error {
	if err := checkShownSHA256(name, certSHA256); err != nil {
		return err
	}
	_, err := a.approve(ctx, name, Shown{CertificateSHA256: certSHA256})
	return err
}

// Shown is what an admin was shown of a runner before deciding to approve it: the values the
// RTE logs at start, for the admin to compare. ApproveShown approves only what was shown.
type Shown struct {
	TokenFingerprint string // the runner's token fingerprint
	URL              string // the address the app dials (inbound)
	// CertificateFingerprint is the short fingerprint of the certificate waiting for approval;
	// CertificateSHA256 its full SHA-256 (colons and case are ignored), which binds the
	// approval to exactly that certificate.
	CertificateFingerprint string
	CertificateSHA256      string
	// Complete says the fields are the whole review the admin saw (the reference app's page):
	// an empty TokenFingerprint, URL or CertificateFingerprint then means that none was shown
	// and is compared like any value, so a certificate that came to wait after the page was
	// drawn is not approved unseen. Without it, empty fields are not compared (the admin API,
	// where the caller names only what it checked). An empty CertificateSHA256 is never
	// compared.
	Complete bool
}

// ChangedError is why ApproveShown (or ApproveCertificate) approved nothing: the runner as
// stored at the moment of approval no longer matches what the admin was shown, typically
// because its RTE registered again in between. For the certificate's fields it wraps
// ErrCertificateChanged.
type ChangedError struct {
	Runner string
	// Field is the first value that differs: "token_fingerprint", "certificate_fingerprint",
	// "certificate_sha256" or "url", named as the RTE logs them.
	Field string
	Shown string  // what the admin was shown of Field
	Now   *Runner // the runner as stored now, to show the admin the new values
}

func (e *ChangedError) Error() string {
	prefix := fmt.Sprintf("approve runner %q: ", e.Runner)
	switch e.Field {
	case "token_fingerprint":
		return prefix + fmt.Sprintf("the runner registered again with another token: its token fingerprint is now %s, not %s", e.Now.TokenFingerprint, protocol.PeerText(e.Shown, 100))
	case "url":
		return prefix + fmt.Sprintf("the runner registered again with another address: it is now %s, not %s", e.Now.URL, protocol.PeerText(e.Shown, 200))
	}
	if e.Now.PendingCertificate == nil {
		return prefix + ErrCertificateChanged.Error() + ": no certificate is waiting for approval"
	}
	if e.Field == "certificate_fingerprint" {
		return prefix + fmt.Sprintf("%v: the certificate waiting is %s (sha256 %s), not %s: compare again with the RTE's log before approving",
			ErrCertificateChanged, protocol.CertificateFingerprint(e.Now.PendingCertificate), protocol.CertificateSHA256(e.Now.PendingCertificate), protocol.PeerText(e.Shown, 100))
	}
	return prefix + fmt.Sprintf("%v: the certificate waiting has sha256 %s: compare again with the RTE's log before approving", ErrCertificateChanged, protocol.CertificateSHA256(e.Now.PendingCertificate))
}

// Unwrap gives ErrCertificateChanged when the certificate is what changed.
func (e *ChangedError) Unwrap() error {
	if strings.HasPrefix(e.Field, "certificate_") {
		return ErrCertificateChanged
	}
	return nil
}

// ApproveShown approves the runner as Approve does, but only if it still is what the admin
// was shown: the comparison and the approval happen under the lock every change to a runner
// takes, so no registration can change the token, the address or the certificate between
// them. It returns the runner as stored afterwards. When something differs it approves
// nothing and returns a *ChangedError naming the first value that differs and holding the
// runner as it is now; an unknown runner is ErrNotFound.
func (a *App) ApproveShown(ctx context.Context, name string, shown Shown) (*Runner, error) {
	if shown.CertificateSHA256 != "" {
		if err := checkShownSHA256(name, shown.CertificateSHA256); err != nil {
			return nil, err
		}
	}
	return a.approve(ctx, name, shown)
}

// checkShownSHA256 refuses anything but a full SHA-256: a short fingerprint given where the
// full one binds the approval would bind nothing.
func checkShownSHA256(name, sha string) error {
	if len(normalSHA256(sha)) != 64 {
		return fmt.Errorf("approve runner %q: %q is not a full SHA-256 of a certificate: give its 64 hex digits, as the RTE logs certificate_sha256", name, protocol.PeerText(sha, 100))
	}
	return nil
}

// normalSHA256 drops colons and spaces and lowers the case of a hex fingerprint.
func normalSHA256(s string) string {
	return strings.ToLower(strings.NewReplacer(":", "", " ", "").Replace(strings.TrimSpace(s)))
}

// differs names the first field of shown that r no longer matches, or "". The order is the
// order an admin compares them in: token, certificate, address.
func (shown Shown) differs(r *Runner) (field, value string) {
	cert, sha := "", ""
	if r.PendingCertificate != nil {
		cert = protocol.CertificateFingerprint(r.PendingCertificate)
		sha = protocol.CertificateSHA256(r.PendingCertificate)
	}
	compare := func(v string) bool { return shown.Complete || strings.TrimSpace(v) != "" }
	switch {
	case compare(shown.TokenFingerprint) && !strings.EqualFold(strings.TrimSpace(shown.TokenFingerprint), r.TokenFingerprint):
		return "token_fingerprint", shown.TokenFingerprint
	case compare(shown.CertificateFingerprint) && !strings.EqualFold(strings.TrimSpace(shown.CertificateFingerprint), cert):
		return "certificate_fingerprint", shown.CertificateFingerprint
	case shown.CertificateSHA256 != "" && (sha == "" || normalSHA256(shown.CertificateSHA256) != normalSHA256(sha)):
		return "certificate_sha256", shown.CertificateSHA256
	case compare(shown.URL) && strings.TrimSpace(shown.URL) != r.URL:
		return "url", shown.URL
	}
	return "", ""
}

func (a *App) approve(ctx context.Context, name string, shown Shown) (*Runner, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.pruneLocked(ctx); err != nil {
		return nil, fmt.Errorf("approve runner %q: %w", name, err)
	}
	r, err := a.cfg.Store.GetRunner(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("approve runner %q: %w", name, err)
	}
	if field, value := shown.differs(r); field != "" {
		return nil, &ChangedError{Runner: name, Field: field, Shown: value, Now: r.Clone()}
	}
	if r.State == StateApproved && r.PendingCertificate == nil {
		return r, nil
	}
	if isHTTPS(r.URL) {
		if r.PendingCertificate == nil {
			return nil, fmt.Errorf("approve runner %q: no certificate is waiting for approval: the runner must register again, or be dialled once so the app sees its certificate", name)
		}
		r.Certificate = r.PendingCertificate
	} else {
		// The runner moved to http:// (or never had TLS): there is nothing to pin, and a stale
		// pin would make the dialer refuse the plain URL.
		r.Certificate = nil
	}
	r.PendingCertificate = nil
	r.State = StateApproved
	r.ApprovedAt = a.cfg.Now()
	undo := a.tellApproved(ctx, r)
	if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
		undo()
		return nil, fmt.Errorf("approve runner %q: %w", name, err)
	}
	a.wakeRun()
	if r.Mode == protocol.ModeOutbound && a.out.peer(name) == nil {
		a.wakeHolder(ctx, name) // its socket may be at another app node
	}
	a.log.Info("runner approved",
		zap.String("name", name),
		zap.String("url", r.URL),
		zap.String("token_fingerprint", r.TokenFingerprint),
		zap.String("certificate_fingerprint", fingerprintOrEmpty(r.Certificate)))
	return r.Clone(), nil
}

// Reject removes the runner and the token stored with it. An RTE that registers again after
// a rejection starts over as a new request. A connected outbound runner hears
// {"type":"rejected","reason"} and its socket is closed with 4003; Reject waits a moment for
// that (see rejectedFlush).
func (a *App) Reject(ctx context.Context, name, reason string) error {
	a.mu.Lock()
	r, err := a.cfg.Store.GetRunner(ctx, name)
	if err == nil {
		err = a.cfg.Store.DeleteRunner(ctx, name)
	}
	var op *outboundPeer
	if err == nil {
		op = a.out.peer(name)
	}
	a.mu.Unlock()
	if err != nil {
		return fmt.Errorf("reject runner %q: %w", name, err)
	}
	a.log.Info("runner rejected and removed",
		zap.String("name", name),
		zap.String("state", string(r.State)),
		zap.String("reason", protocol.PeerText(reason, 300)))
	if op != nil {
		a.tellRejected(ctx, op, reason)
	} else {
		a.wakeHolder(ctx, name) // another app node may hold its socket, and closes it
	}
	return nil
}

// ClearWaiting rejects every registration request no admin has decided on yet, at once: the
// way out when someone filled the waiting slots. Connected waiting outbound runners hear
// rejected with reason and are closed with 4003. Runners that were approved once and wait
// only for a changed certificate are kept. It returns the names removed.
func (a *App) ClearWaiting(ctx context.Context, reason string) ([]string, error) {
	a.mu.Lock()
	runners, err := a.cfg.Store.ListRunners(ctx)
	if err != nil {
		a.mu.Unlock()
		return nil, fmt.Errorf("clear waiting requests: %w", err)
	}
	var names []string
	var peers []*outboundPeer
	for _, r := range runners {
		if !isRequest(r) {
			continue
		}
		if err := a.cfg.Store.DeleteRunner(ctx, r.Name); err != nil && !errors.Is(err, ErrNotFound) {
			a.mu.Unlock()
			return names, fmt.Errorf("clear waiting request of runner %q: %w", r.Name, err)
		}
		names = append(names, r.Name)
		if op := a.out.peer(r.Name); op != nil {
			peers = append(peers, op)
		}
	}
	a.mu.Unlock()
	a.log.Info("waiting registration requests cleared by an admin", zap.Strings("names", names), zap.String("reason", protocol.PeerText(reason, 300)))
	var wg sync.WaitGroup
	for _, op := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.tellRejected(ctx, op, reason)
		}()
	}
	wg.Wait()
	for _, n := range names {
		a.wakeHolder(ctx, n) // another app node may hold its socket, and closes it
	}
	return names, nil
}
