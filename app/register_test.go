package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

func baseRequest(cert testCert) protocol.RegisterRequest {
	return protocol.RegisterRequest{
		Name:        "rte01",
		URL:         "https://rte01.example.com:8000",
		Token:       testToken,
		Certificate: cert.pem,
		Version:     "1.2.3",
		MaxJobs:     10,
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRegisterRefusesBadRequests(t *testing.T) {
	cert := newCert(t)
	with := func(edit func(*protocol.RegisterRequest)) []byte {
		r := baseRequest(cert)
		edit(&r)
		return mustJSON(t, r)
	}
	garbageCert := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")}))
	keyOnly := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("x")}))
	tests := []struct {
		name string
		body []byte
		want int
		says string
	}{
		{"not JSON", []byte("{not json"), 400, "not a registration JSON object"},
		{"JSON array", []byte("[]"), 400, "not a registration JSON object"},
		{"name of wrong type", []byte(`{"name":5}`), 400, "name must be a JSON string"},
		{"empty object", []byte(`{}`), 400, "name is required"},
		{"no name", with(func(r *protocol.RegisterRequest) { r.Name = "" }), 400, "name is required"},
		{"name with newline", with(func(r *protocol.RegisterRequest) { r.Name = "rte01\nforged log line" }), 400, "control characters"},
		{"name too long", with(func(r *protocol.RegisterRequest) { r.Name = strings.Repeat("n", 129) }), 400, "at most 128"},
		{"no url", with(func(r *protocol.RegisterRequest) { r.URL = "" }), 400, "url is required"},
		{"relative url", with(func(r *protocol.RegisterRequest) { r.URL = "/rte01" }), 400, "not an absolute http:// or https:// URL"},
		{"ftp url", with(func(r *protocol.RegisterRequest) { r.URL = "ftp://rte01:21" }), 400, "not an absolute http:// or https:// URL"},
		{"url without host", with(func(r *protocol.RegisterRequest) { r.URL = "https://" }), 400, "has no host"},
		{"url with credentials", with(func(r *protocol.RegisterRequest) { r.URL = "https://user:pw@rte01:8000" }), 400, "carries credentials"},
		{"no token", with(func(r *protocol.RegisterRequest) { r.Token = "" }), 400, "token is required"},
		{"short token", with(func(r *protocol.RegisterRequest) { r.Token = "short-token" }), 400, "at least 16"},
		{"token with control character", with(func(r *protocol.RegisterRequest) { r.Token = "0123456789abcdef\r\nX: y" }), 400, "control characters"},
		{"https without certificate", with(func(r *protocol.RegisterRequest) { r.Certificate = "" }), 400, "no certificate was sent"},
		{"certificate not PEM", with(func(r *protocol.RegisterRequest) { r.Certificate = "MIIB not pem" }), 400, "no PEM CERTIFICATE block"},
		{"certificate PEM of a key", with(func(r *protocol.RegisterRequest) { r.Certificate = keyOnly }), 400, "no PEM CERTIFICATE block"},
		{"certificate block does not parse", with(func(r *protocol.RegisterRequest) { r.Certificate = garbageCert }), 400, "does not parse"},
		{"http with certificate", with(func(r *protocol.RegisterRequest) { r.URL = "http://rte01:8000" }), 400, "http:// but a certificate was sent"},
		{"body over 1 MiB", with(func(r *protocol.RegisterRequest) { r.Version = strings.Repeat("v", 1<<20) }), 413, "larger than"},
	}
	ta := newTestApp(t, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, resp := ta.post(t, tt.body)
			if status != tt.want || !strings.Contains(resp.Error, tt.says) {
				t.Errorf("got %d %q, want %d with an error saying %q", status, resp.Error, tt.want, tt.says)
			}
			if resp.State != "" {
				t.Errorf("a refusal carries state %q, want none", resp.State)
			}
		})
	}
	if rs, _ := ta.ListRunners(context.Background()); len(rs) != 0 {
		t.Errorf("refused registrations left %d runners in the store, want 0", len(rs))
	}
}

func TestRegisterOnlyPost(t *testing.T) {
	ta := newTestApp(t, nil)
	resp, err := ta.srv.Client().Get(ta.srv.URL + protocol.RegisterPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodPost {
		t.Errorf("GET got %d with Allow %q, want 405 with Allow POST", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

func TestRegisterNewRunnerWaitsForApproval(t *testing.T) {
	ta := newTestApp(t, nil)
	cert := newCert(t)
	status, resp := ta.register(t, baseRequest(cert))
	want := protocol.RegisterResponse{
		State:                  protocol.StatePending,
		TokenFingerprint:       protocol.TokenFingerprint(testToken),
		CertificateFingerprint: protocol.CertificateFingerprint(cert.der),
	}
	if status != http.StatusAccepted || resp != want {
		t.Fatalf("got %d %+v, want 202 %+v", status, resp, want)
	}
	r := ta.runner(t, "rte01")
	if r.State != app.StateWaiting || !bytes.Equal(r.PendingCertificate, cert.der) || r.Certificate != nil {
		t.Errorf("runner is %s with pending %v and certificate %v, want waiting with the sent certificate pending and none approved",
			r.State, r.PendingCertificate != nil, r.Certificate != nil)
	}
	if r.Token != testToken || r.TokenFingerprint != want.TokenFingerprint || r.URL != "https://rte01.example.com:8000" || r.Mode != protocol.ModeInbound || r.Version != "1.2.3" {
		t.Errorf("runner stored as %+v, want the request's token, url and version, mode inbound", r)
	}
	if r.MaxJobs != 0 {
		t.Errorf("runner MaxJobs = %d, want 0: the registered max_jobs is the RTE's own, not an override", r.MaxJobs)
	}
	if !strings.HasPrefix(r.RemoteAddr, "127.0.0.1:") || !r.RequestedAt.Equal(ta.clock.Now()) || !r.ApprovedAt.IsZero() {
		t.Errorf("runner remote addr %q, requested %s, approved %s; want 127.0.0.1, now, never", r.RemoteAddr, r.RequestedAt, r.ApprovedAt)
	}

	// The log line an admin reads: name, url, remote address and both fingerprints.
	entries := ta.logs.FilterMessageSnippet("registration waiting").All()
	if len(entries) != 1 {
		t.Fatalf("got %d 'registration waiting' log lines, want 1", len(entries))
	}
	fields := entries[0].ContextMap()
	for k, v := range map[string]string{"name": "rte01", "url": "https://rte01.example.com:8000",
		"token_fingerprint": want.TokenFingerprint, "certificate_fingerprint": want.CertificateFingerprint} {
		if fields[k] != v {
			t.Errorf("log field %s = %v, want %q", k, fields[k], v)
		}
	}
	if ra, _ := fields["remote_addr"].(string); !strings.HasPrefix(ra, "127.0.0.1:") {
		t.Errorf("log field remote_addr = %v, want 127.0.0.1:port", fields["remote_addr"])
	}

	if err := ta.Approve(context.Background(), "rte01"); err != nil {
		t.Fatalf("approve: %v", err)
	}
	r = ta.runner(t, "rte01")
	if r.State != app.StateApproved || !bytes.Equal(r.Certificate, cert.der) || r.PendingCertificate != nil || r.ApprovedAt.IsZero() {
		t.Errorf("after approval the runner is %s, pinned %v, pending %v; want approved with the certificate pinned and nothing pending",
			r.State, bytes.Equal(r.Certificate, cert.der), r.PendingCertificate != nil)
	}
}

func TestRegisterWithJoinToken(t *testing.T) {
	cert := newCert(t)
	t.Run("matching join token approves at once", func(t *testing.T) {
		ta := newTestApp(t, nil)
		req := baseRequest(cert)
		req.JoinToken = testJoin
		status, resp := ta.register(t, req)
		if status != http.StatusCreated || resp.State != protocol.StateApproved {
			t.Fatalf("got %d %+v, want 201 approved", status, resp)
		}
		r := ta.runner(t, "rte01")
		if r.State != app.StateApproved || !bytes.Equal(r.Certificate, cert.der) {
			t.Errorf("runner is %s, pinned %v; want approved with the sent certificate pinned", r.State, bytes.Equal(r.Certificate, cert.der))
		}
	})
	t.Run("wrong join token", func(t *testing.T) {
		ta := newTestApp(t, nil)
		req := baseRequest(cert)
		req.JoinToken = "not-the-join-token-at-all"
		status, resp := ta.register(t, req)
		if status != http.StatusForbidden || !strings.Contains(resp.Error, "RTE_JOIN_TOKEN") {
			t.Fatalf("got %d %q, want 403 naming RTE_JOIN_TOKEN", status, resp.Error)
		}
		if _, err := ta.store.GetRunner(context.Background(), "rte01"); !errors.Is(err, app.ErrNotFound) {
			t.Errorf("a refused join left a runner behind (%v), want none", err)
		}
	})
	t.Run("join token when the app has none", func(t *testing.T) {
		ta := newTestApp(t, func(c *app.Config) { c.JoinToken = "" })
		req := baseRequest(cert)
		req.JoinToken = testJoin
		status, resp := ta.register(t, req)
		if status != http.StatusForbidden || !strings.Contains(resp.Error, "accepts no join token") {
			t.Fatalf("got %d %q, want 403 saying the app accepts no join token", status, resp.Error)
		}
	})
	t.Run("join token approves a waiting request", func(t *testing.T) {
		ta := newTestApp(t, nil)
		if status, _ := ta.register(t, baseRequest(cert)); status != http.StatusAccepted {
			t.Fatalf("first registration got %d, want 202", status)
		}
		req := baseRequest(cert)
		req.JoinToken = testJoin
		if status, resp := ta.register(t, req); status != http.StatusCreated {
			t.Fatalf("got %d %+v, want 201", status, resp)
		}
		if r := ta.runner(t, "rte01"); r.State != app.StateApproved || r.PendingCertificate != nil {
			t.Errorf("runner is %s with pending %v, want approved with nothing pending", r.State, r.PendingCertificate != nil)
		}
	})
}

// TestRegisterUpdatesWaitingRequest: the RTE that made a request (its token) may refresh it,
// certificate and address included; the admin's approval is then bound to the SHA-256 shown.
func TestRegisterUpdatesWaitingRequest(t *testing.T) {
	ta := newTestApp(t, nil)
	cert1, cert2 := newCert(t), newCert(t)
	if status, _ := ta.register(t, baseRequest(cert1)); status != http.StatusAccepted {
		t.Fatalf("first registration got %d, want 202", status)
	}
	ta.clock.Advance(time.Hour)
	req := baseRequest(cert2)
	req.URL = "https://rte01.example.com:9000"
	status, resp := ta.register(t, req)
	if status != http.StatusAccepted || resp.CertificateFingerprint != protocol.CertificateFingerprint(cert2.der) || resp.TokenFingerprint != protocol.TokenFingerprint(req.Token) {
		t.Fatalf("got %d %+v, want 202 with the new fingerprints", status, resp)
	}
	r := ta.runner(t, "rte01")
	if !bytes.Equal(r.PendingCertificate, cert2.der) || r.Token != req.Token || r.URL != req.URL || !r.RequestedAt.Equal(ta.clock.Now()) {
		t.Errorf("waiting request not replaced: pending is new %v, token is new %v, url %q, requested %s",
			bytes.Equal(r.PendingCertificate, cert2.der), r.Token == req.Token, r.URL, r.RequestedAt)
	}
}

// TestRegisterWaitingRequestKeptFromOtherTokens: a caller without the request's token cannot
// replace a waiting request (issue 10: a certificate ground to match the short fingerprint
// could be slipped in while the admin compares); the answer names no fingerprint.
func TestRegisterWaitingRequestKeptFromOtherTokens(t *testing.T) {
	ta := newTestApp(t, nil)
	cert1, cert2 := newCert(t), newCert(t)
	if status, _ := ta.register(t, baseRequest(cert1)); status != http.StatusAccepted {
		t.Fatalf("first registration got %d, want 202", status)
	}
	before := ta.runner(t, "rte01")
	req := baseRequest(cert2)
	req.Token = "another-token-0123456789"
	req.URL = "https://evil.example.com:9000"
	status, resp := ta.register(t, req)
	if status != http.StatusConflict || !strings.Contains(resp.Error, "already has a registration request waiting, made with another token") ||
		strings.Contains(resp.Error, before.TokenFingerprint) || resp.TokenFingerprint != "" {
		t.Fatalf("got %d %+v, want 409 saying a request waits with another token, naming no fingerprint", status, resp)
	}
	after := ta.runner(t, "rte01")
	if !bytes.Equal(after.PendingCertificate, cert1.der) || after.Token != testToken || after.URL != before.URL {
		t.Fatalf("a caller without the token changed the waiting request: pending kept %v, token kept %v, url %q",
			bytes.Equal(after.PendingCertificate, cert1.der), after.Token == testToken, after.URL)
	}
	if err := ta.ApproveCertificate(context.Background(), "rte01", protocol.CertificateSHA256(cert2.der)); !errors.Is(err, app.ErrCertificateChanged) {
		t.Fatalf("approving the other certificate's SHA-256 = %v, want ErrCertificateChanged", err)
	}
	if r := ta.runner(t, "rte01"); r.State != app.StateWaiting {
		t.Fatalf("runner is %s after a refused approval, want waiting", r.State)
	}
	if err := ta.ApproveCertificate(context.Background(), "rte01", strings.ToUpper(protocol.CertificateSHA256(cert1.der))); err != nil {
		t.Fatalf("approving the shown certificate's SHA-256: %v", err)
	}
	if r := ta.runner(t, "rte01"); r.State != app.StateApproved || !bytes.Equal(r.Certificate, cert1.der) {
		t.Fatalf("runner is %s, pinned to the shown certificate %v; want approved on it", r.State, bytes.Equal(r.Certificate, cert1.der))
	}
}

func approvedRunner(t *testing.T, ta *testApp, cert testCert) {
	t.Helper()
	req := baseRequest(cert)
	req.JoinToken = testJoin
	if status, resp := ta.register(t, req); status != http.StatusCreated {
		t.Fatalf("join got %d %+v, want 201", status, resp)
	}
}

func TestRegisterApprovedRunnerRestarts(t *testing.T) {
	ta := newTestApp(t, nil)
	cert := newCert(t)
	approvedRunner(t, ta, cert)
	req := baseRequest(cert)
	req.Version = "1.2.4"
	status, resp := ta.register(t, req) // no join token this time: the approval stands
	if status != http.StatusCreated || resp.State != protocol.StateApproved {
		t.Fatalf("re-registration got %d %+v, want 201 approved", status, resp)
	}
	if r := ta.runner(t, "rte01"); r.State != app.StateApproved || r.Version != "1.2.4" || !bytes.Equal(r.Certificate, cert.der) {
		t.Errorf("runner is %s version %q pinned %v, want approved, version 1.2.4, same pin", r.State, r.Version, bytes.Equal(r.Certificate, cert.der))
	}
}

func TestRegisterApprovedRunnerCertificateChanged(t *testing.T) {
	ta := newTestApp(t, nil)
	cert1, cert2 := newCert(t), newCert(t)
	approvedRunner(t, ta, cert1)

	req := baseRequest(cert2)
	req.JoinToken = testJoin // the join token approves first joins only, never a change
	status, resp := ta.register(t, req)
	if status != http.StatusConflict {
		t.Fatalf("changed certificate got %d %+v, want 409", status, resp)
	}
	for _, want := range []string{protocol.CertificateFingerprint(cert1.der), protocol.CertificateFingerprint(cert2.der), "admin must approve"} {
		if !strings.Contains(resp.Error, want) {
			t.Errorf("409 error %q does not say %q", resp.Error, want)
		}
	}
	r := ta.runner(t, "rte01")
	if r.State != app.StateWaiting || !bytes.Equal(r.Certificate, cert1.der) || !bytes.Equal(r.PendingCertificate, cert2.der) {
		t.Fatalf("runner is %s, old pin kept %v, new pending %v; want waiting with both certificates",
			r.State, bytes.Equal(r.Certificate, cert1.der), bytes.Equal(r.PendingCertificate, cert2.der))
	}

	// Registering again while the change waits: still pending, not approved.
	if status, resp := ta.register(t, baseRequest(cert2)); status != http.StatusAccepted || resp.State != protocol.StatePending {
		t.Errorf("re-registration during the wait got %d %+v, want 202 pending", status, resp)
	}

	// Restoring the old certificate and key needs no admin: it is the approved one.
	if status, resp := ta.register(t, baseRequest(cert1)); status != http.StatusCreated {
		t.Errorf("registration with the approved certificate got %d %+v, want 201", status, resp)
	}
	if r := ta.runner(t, "rte01"); r.State != app.StateApproved || r.PendingCertificate != nil {
		t.Errorf("after restoring the certificate the runner is %s with pending %v, want approved with nothing pending", r.State, r.PendingCertificate != nil)
	}

	// Change again, and this time the admin approves the new certificate.
	if status, _ := ta.register(t, baseRequest(cert2)); status != http.StatusConflict {
		t.Fatalf("second change got %d, want 409", status)
	}
	if err := ta.Approve(context.Background(), "rte01"); err != nil {
		t.Fatal(err)
	}
	if r := ta.runner(t, "rte01"); r.State != app.StateApproved || !bytes.Equal(r.Certificate, cert2.der) {
		t.Errorf("after approval the runner is %s pinned to the new certificate %v, want approved on the new one", r.State, bytes.Equal(r.Certificate, cert2.der))
	}
}

func TestRegisterApprovedRunnerWithAnotherTokenChangesNothing(t *testing.T) {
	ta := newTestApp(t, nil)
	cert1, cert2 := newCert(t), newCert(t)
	approvedRunner(t, ta, cert1)
	before := ta.runner(t, "rte01")

	req := baseRequest(cert2)
	req.Token = "somebody-elses-token-0123"
	req.URL = "https://evil.example.com:8000"
	status, resp := ta.register(t, req)
	// Issue 10: the answer once named the approved token's fingerprint to anyone who asked.
	if status != http.StatusConflict || !strings.Contains(resp.Error, "token") || strings.Contains(resp.Error, before.TokenFingerprint) {
		t.Fatalf("got %d %q, want 409 about the token that does not name the approved fingerprint %s", status, resp.Error, before.TokenFingerprint)
	}
	after := ta.runner(t, "rte01")
	if after.State != app.StateApproved || after.Token != testToken || after.URL != before.URL || after.PendingCertificate != nil {
		t.Errorf("a registration without the runner's token changed it: state %s, url %q, token kept %v, pending %v",
			after.State, after.URL, after.Token == testToken, after.PendingCertificate != nil)
	}
}

func TestRegisterApprovedRunnerDroppingTLSWaits(t *testing.T) {
	ta := newTestApp(t, nil)
	cert := newCert(t)
	approvedRunner(t, ta, cert)
	req := baseRequest(cert)
	req.URL, req.Certificate = "http://rte01.example.com:8000", ""
	status, resp := ta.register(t, req)
	if status != http.StatusConflict || !strings.Contains(resp.Error, "without a certificate") {
		t.Fatalf("https to http got %d %q, want 409 saying the certificate is gone", status, resp.Error)
	}
	if r := ta.runner(t, "rte01"); r.State != app.StateWaiting {
		t.Fatalf("runner is %s, want waiting", r.State)
	}
	if err := ta.Approve(context.Background(), "rte01"); err != nil {
		t.Fatal(err)
	}
	if r := ta.runner(t, "rte01"); r.State != app.StateApproved || r.Certificate != nil || r.URL != req.URL {
		t.Errorf("approved downgrade: state %s, pin kept %v, url %q; want approved, no pin, http url", r.State, r.Certificate != nil, r.URL)
	}
}

func TestRegisterBoundsWaitingRequests(t *testing.T) {
	ta := newTestApp(t, func(c *app.Config) { c.MaxWaiting = 2 })
	cert := newCert(t)
	reg := func(name, join string) (int, protocol.RegisterResponse) {
		req := baseRequest(cert)
		req.Name, req.JoinToken = name, join
		return ta.register(t, req)
	}
	for _, name := range []string{"a", "b"} {
		if status, _ := reg(name, ""); status != http.StatusAccepted {
			t.Fatalf("%s got %d, want 202", name, status)
		}
	}
	status, resp := reg("c", "")
	if status != http.StatusTooManyRequests || !strings.Contains(resp.Error, "2 registration requests already wait") {
		t.Fatalf("third request got %d %q, want 429 saying 2 wait", status, resp.Error)
	}
	if status, _ := reg("a", ""); status != http.StatusAccepted {
		t.Errorf("a waiting runner registering again got %d, want 202: it takes no new place", status)
	}
	if status, _ := reg("d", testJoin); status != http.StatusCreated {
		t.Errorf("a join-token registration got %d, want 201: it never waits", status)
	}
}

func TestRegisterDropsRequestsAfterWaitingTTL(t *testing.T) {
	ta := newTestApp(t, func(c *app.Config) { c.MaxWaiting = 2 })
	cert1, cert2 := newCert(t), newCert(t)
	ctx := context.Background()
	reg := func(name string, cert testCert) int {
		req := baseRequest(cert)
		req.Name = name
		status, _ := ta.register(t, req)
		return status
	}
	// An approved runner whose certificate changed waits too, but it must never be dropped.
	approvedRunner(t, ta, cert1)
	if status := reg("rte01", cert2); status != http.StatusConflict {
		t.Fatalf("certificate change got %d, want 409", status)
	}
	if status := reg("old", cert1); status != http.StatusAccepted {
		t.Fatalf("old got %d, want 202", status)
	}
	ta.clock.Advance(23 * time.Hour)
	if status := reg("newer", cert1); status != http.StatusAccepted {
		t.Fatalf("newer got %d, want 202", status)
	}
	if status := reg("third", cert1); status != http.StatusTooManyRequests {
		t.Fatalf("third got %d, want 429 while two requests wait", status)
	}
	ta.clock.Advance(time.Hour + time.Second) // "old" has now waited 24h and a second
	if status := reg("third", cert1); status != http.StatusAccepted {
		t.Fatalf("third got %d after the oldest request expired, want 202", status)
	}
	if _, err := ta.store.GetRunner(ctx, "old"); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("expired request still stored (%v), want it dropped", err)
	}

	// ListRunners drops expired requests on its own, without a registration, and an admin
	// cannot approve one that expired while the page showed it.
	ta.clock.Advance(25 * time.Hour)
	if err := ta.Approve(ctx, "third"); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("approving an expired request got %v, want ErrNotFound", err)
	}
	rs, err := ta.ListRunners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Name != "rte01" || rs[0].State != app.StateWaiting || !bytes.Equal(rs[0].PendingCertificate, cert2.der) {
		names := make([]string, len(rs))
		for i, r := range rs {
			names[i] = r.Name + ":" + string(r.State)
		}
		t.Errorf("after 49h ListRunners returns %v, want only rte01:waiting with its changed certificate pending", names)
	}
}

func TestRegisterRunnerAddedByHand(t *testing.T) {
	cert, other := newCert(t), newCert(t)
	add := func(t *testing.T, ta *testApp, sha string) {
		t.Helper()
		err := ta.AddRunner(context.Background(), &app.Runner{Name: "rte01", URL: "https://rte01.example.com:8000", Token: testToken, CertificateSHA256: sha})
		if err != nil {
			t.Fatalf("add runner: %v", err)
		}
	}
	t.Run("no pin: the registered certificate waits for approval", func(t *testing.T) {
		ta := newTestApp(t, nil)
		add(t, ta, "")
		if status, resp := ta.register(t, baseRequest(cert)); status != http.StatusAccepted {
			t.Fatalf("got %d %+v, want 202", status, resp)
		}
		if r := ta.runner(t, "rte01"); r.State != app.StateWaiting || !bytes.Equal(r.PendingCertificate, cert.der) {
			t.Errorf("runner is %s with the certificate pending %v, want waiting with it pending", r.State, bytes.Equal(r.PendingCertificate, cert.der))
		}
	})
	t.Run("matching fingerprint pins it", func(t *testing.T) {
		ta := newTestApp(t, nil)
		add(t, ta, protocol.CertificateSHA256(cert.der))
		if status, resp := ta.register(t, baseRequest(cert)); status != http.StatusCreated {
			t.Fatalf("got %d %+v, want 201", status, resp)
		}
		if r := ta.runner(t, "rte01"); r.State != app.StateApproved || !bytes.Equal(r.Certificate, cert.der) {
			t.Errorf("runner is %s pinned %v, want approved and pinned", r.State, bytes.Equal(r.Certificate, cert.der))
		}
	})
	t.Run("other fingerprint is a change", func(t *testing.T) {
		ta := newTestApp(t, nil)
		add(t, ta, protocol.CertificateSHA256(other.der))
		status, resp := ta.register(t, baseRequest(cert))
		if status != http.StatusConflict || !strings.Contains(resp.Error, protocol.CertificateSHA256(other.der)) {
			t.Fatalf("got %d %q, want 409 naming the configured fingerprint", status, resp.Error)
		}
		if r := ta.runner(t, "rte01"); r.State != app.StateWaiting || !bytes.Equal(r.PendingCertificate, cert.der) {
			t.Errorf("runner is %s, want waiting with the presented certificate pending", r.State)
		}
	})
	t.Run("no pin, with the join token: pinned at once", func(t *testing.T) {
		ta := newTestApp(t, nil)
		add(t, ta, "")
		req := baseRequest(cert)
		req.JoinToken = testJoin
		if status, resp := ta.register(t, req); status != http.StatusCreated || resp.State != protocol.StateApproved {
			t.Fatalf("got %d %+v, want 201 approved", status, resp)
		}
		r := ta.runner(t, "rte01")
		if r.State != app.StateApproved || !bytes.Equal(r.Certificate, cert.der) || r.PendingCertificate != nil {
			t.Errorf("runner is %s, pinned %v, pending %v; want approved with the sent certificate pinned and nothing pending",
				r.State, bytes.Equal(r.Certificate, cert.der), r.PendingCertificate != nil)
		}
		// A restart registers the same certificate again: still approved, no admin needed.
		if status, _ := ta.register(t, baseRequest(cert)); status != http.StatusCreated {
			t.Errorf("the same certificate again got %d, want 201", status)
		}
		// Once pinned, the join token approves no other certificate.
		req = baseRequest(other)
		req.JoinToken = testJoin
		if status, resp := ta.register(t, req); status != http.StatusConflict {
			t.Errorf("another certificate with the join token got %d %+v, want 409", status, resp)
		}
	})
	t.Run("no pin, a dial met the certificate first, then the join token", func(t *testing.T) {
		ta := newTestApp(t, nil)
		add(t, ta, "")
		// What holdForApproval leaves after a trust-on-first-use dial: waiting, approved before.
		r := ta.runner(t, "rte01")
		r.State, r.PendingCertificate = app.StateWaiting, other.der
		if err := ta.store.PutRunner(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		req := baseRequest(cert)
		req.JoinToken = testJoin
		if status, resp := ta.register(t, req); status != http.StatusCreated {
			t.Fatalf("got %d %+v, want 201", status, resp)
		}
		if r := ta.runner(t, "rte01"); r.State != app.StateApproved || !bytes.Equal(r.Certificate, cert.der) || r.PendingCertificate != nil {
			t.Errorf("runner is %s, pinned %v, pending %v; want approved with the registered certificate pinned",
				r.State, bytes.Equal(r.Certificate, cert.der), r.PendingCertificate != nil)
		}
	})
	t.Run("join token does not override a configured fingerprint", func(t *testing.T) {
		ta := newTestApp(t, nil)
		add(t, ta, protocol.CertificateSHA256(other.der))
		req := baseRequest(cert)
		req.JoinToken = testJoin
		if status, resp := ta.register(t, req); status != http.StatusConflict {
			t.Fatalf("got %d %+v, want 409: the operator named another certificate", status, resp)
		}
		if r := ta.runner(t, "rte01"); r.Certificate != nil || r.State != app.StateWaiting {
			t.Errorf("runner is %s, pinned %v; want waiting, nothing pinned", r.State, r.Certificate != nil)
		}
	})
	t.Run("join token with another runner's token changes nothing", func(t *testing.T) {
		ta := newTestApp(t, nil)
		add(t, ta, "")
		req := baseRequest(cert)
		req.JoinToken = testJoin
		req.Token = strings.Repeat("x", protocol.MinTokenLength+4)
		if status, resp := ta.register(t, req); status != http.StatusConflict {
			t.Fatalf("got %d %+v, want 409 for the wrong runner token", status, resp)
		}
		if r := ta.runner(t, "rte01"); r.Certificate != nil {
			t.Error("a registration with the wrong runner token pinned a certificate")
		}
	})
	t.Run("name of an outbound runner", func(t *testing.T) {
		ta := newTestApp(t, nil)
		if err := ta.AddRunner(context.Background(), &app.Runner{Name: "rte01", Mode: protocol.ModeOutbound, Token: testToken}); err != nil {
			t.Fatal(err)
		}
		if status, resp := ta.register(t, baseRequest(cert)); status != http.StatusConflict || !strings.Contains(resp.Error, "outbound") {
			t.Errorf("got %d %q, want 409 saying the name is an outbound runner's", status, resp.Error)
		}
	})
}

func TestReject(t *testing.T) {
	ta := newTestApp(t, nil)
	ctx := context.Background()
	if status, _ := ta.register(t, baseRequest(newCert(t))); status != http.StatusAccepted {
		t.Fatalf("registration got %d, want 202", status)
	}
	if err := ta.Reject(ctx, "rte01", "not ours"); err != nil {
		t.Fatalf("reject: %v", err)
	}
	if _, err := ta.store.GetRunner(ctx, "rte01"); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("rejected runner still stored (%v), want it removed with its token", err)
	}
	if err := ta.Reject(ctx, "rte01", ""); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("second reject got %v, want ErrNotFound", err)
	}
	if err := ta.Approve(ctx, "rte01"); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("approving a removed runner got %v, want ErrNotFound", err)
	}
}

func TestApproveNeedsACertificateForHTTPS(t *testing.T) {
	ta := newTestApp(t, nil)
	ctx := context.Background()
	cert := newCert(t)
	if err := ta.AddRunner(ctx, &app.Runner{Name: "rte01", URL: "https://127.0.0.1:1", Token: testToken}); err != nil {
		t.Fatal(err)
	}
	r := ta.runner(t, "rte01")
	r.State = app.StateWaiting
	if err := ta.store.PutRunner(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := ta.Approve(ctx, "rte01"); err == nil || !strings.Contains(err.Error(), "no certificate is waiting") {
		t.Errorf("approving an https runner with nothing pending got %v, want an error saying no certificate waits", err)
	}
	// Already approved with nothing pending: approving again changes nothing.
	ta = newTestApp(t, nil)
	approvedRunner(t, ta, cert)
	if err := ta.Approve(ctx, "rte01"); err != nil {
		t.Errorf("approving an approved runner again got %v, want nil", err)
	}
}

func TestAddRunnerRefusals(t *testing.T) {
	cert := newCert(t)
	ok := func() *app.Runner {
		return &app.Runner{Name: "rte01", URL: "https://127.0.0.1:8000", Token: testToken}
	}
	tests := []struct {
		name string
		edit func(*app.Runner)
		says string
	}{
		{"no name", func(r *app.Runner) { r.Name = "" }, "name is required"},
		{"short token", func(r *app.Runner) { r.Token = "short" }, "at least 16"},
		{"no url", func(r *app.Runner) { r.URL = "" }, "url is required"},
		{"bad url", func(r *app.Runner) { r.URL = "rte01" }, "not an absolute"},
		{"bad mode", func(r *app.Runner) { r.Mode = "ftp" }, "is not inbound, outbound or database"},
		{"short fingerprint", func(r *app.Runner) { r.CertificateSHA256 = "abcd-ef12" }, "64 hex digits"},
		{"certificate that does not parse", func(r *app.Runner) { r.Certificate = []byte("x") }, "does not parse"},
		{"certificate and other fingerprint", func(r *app.Runner) {
			r.Certificate, r.CertificateSHA256 = cert.der, strings.Repeat("ab", 32)
		}, "is not the fingerprint given"},
		{"pin on http", func(r *app.Runner) { r.URL, r.Certificate = "http://127.0.0.1:8000", cert.der }, "not https://"},
		{"negative max jobs", func(r *app.Runner) { r.MaxJobs = -1 }, "must not be negative"},
	}
	ta := newTestApp(t, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok()
			tt.edit(r)
			if err := ta.AddRunner(context.Background(), r); err == nil || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("got %v, want an error saying %q", err, tt.says)
			}
		})
	}
	if err := ta.AddRunner(context.Background(), ok()); err != nil {
		t.Fatalf("valid runner refused: %v", err)
	}
	if err := ta.AddRunner(context.Background(), ok()); !errors.Is(err, app.ErrExists) {
		t.Errorf("adding the same name twice got %v, want ErrExists", err)
	}
	r := ta.runner(t, "rte01")
	if r.State != app.StateApproved || r.Mode != protocol.ModeInbound || r.TokenFingerprint != protocol.TokenFingerprint(testToken) {
		t.Errorf("added runner is %s, mode %q, token fingerprint %q; want approved inbound with its fingerprint", r.State, r.Mode, r.TokenFingerprint)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	_, err := app.New(app.Config{JoinToken: "short", MaxWaiting: -1, WaitingTTL: -time.Second})
	if err == nil {
		t.Fatal("New accepted an empty config")
	}
	for _, want := range []string{"Store is required", "Node is required", "JoinToken is 5 characters", "MaxWaiting -1", "WaitingTTL -1s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("config error %q does not say %q", err, want)
		}
	}
}
