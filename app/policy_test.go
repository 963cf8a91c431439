package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// TestSubmitErrorsAreTyped: an app author tells every reason Submit queued nothing apart with
// errors.Is and errors.As, without reading the text, and nothing is stored for any of them.
func TestSubmitErrorsAreTyped(t *testing.T) {
	ctx := context.Background()
	ta := newTestApp(t, nil)
	if err := ta.AddRunner(ctx, &app.Runner{Name: "rte01", URL: "https://127.0.0.1:1", Token: testToken}); err != nil {
		t.Fatal(err)
	}
	put := func(name string, edit func(*app.Runner)) {
		r := ta.runner(t, "rte01")
		r.Name = name
		edit(r)
		if err := ta.store.PutRunner(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	put("waiting", func(r *app.Runner) { r.State = app.StateWaiting })
	put("transfer", func(r *app.Runner) { r.Files = protocol.FilesTransfer })
	put("legacy", func(r *app.Runner) { r.Mode = app.ModeDatabase })
	put("containers", func(r *app.Runner) { r.Images = []string{"rte:dev", "registry.example/ee-*"} })

	start := func(edit func(*protocol.JobStart)) protocol.JobStart {
		js := protocol.JobStart{Playbook: "site.yml"}
		if edit != nil {
			edit(&js)
		}
		return js
	}
	tests := []struct {
		name   string
		runner string
		start  protocol.JobStart
		is     []error
		field  string    // the *protocol.FieldError's field, when one is wanted
		state  app.State // the *app.RefusedError's state, when one is wanted
		not    []error   // what it must not match
		says   string    // in the text
	}{
		{name: "env name", runner: "rte01", start: start(func(js *protocol.JobStart) { js.Env = map[string]string{"A=B": "x"} }),
			is: []error{app.ErrInvalidJob}, field: "env", not: []error{app.ErrRefused}, says: `env: "A=B" is not a variable name`},
		{name: "tag with a comma", runner: "rte01", start: start(func(js *protocol.JobStart) { js.SkipTags = []string{"a,b"} }),
			is: []error{app.ErrInvalidJob}, field: "skip_tags[0]", says: "must be a non-empty tag without commas"},
		{name: "no playbook", runner: "rte01", start: start(func(js *protocol.JobStart) { js.Playbook = "" }),
			is: []error{app.ErrInvalidJob}, field: "playbook"},
		{name: "too large", runner: "rte01", start: start(func(js *protocol.JobStart) {
			js.Extravars = []byte(`{"x":"` + strings.Repeat("x", protocol.MaxMessageBytes) + `"}`)
		}), is: []error{app.ErrInvalidJob}, says: "the limit is"},
		{name: "invalid before the runner is looked up", runner: "nobody", start: start(func(js *protocol.JobStart) { js.Verbosity = 7 }),
			is: []error{app.ErrInvalidJob}, field: "verbosity", not: []error{app.ErrNotFound}},
		{name: "unknown runner", runner: "nobody", start: start(nil), is: []error{app.ErrNotFound}, not: []error{app.ErrInvalidJob, app.ErrRefused}},
		{name: "waiting runner", runner: "waiting", start: start(nil), is: []error{app.ErrRefused, app.ErrNotApproved},
			state: app.StateWaiting, not: []error{app.ErrNoFiles}, says: `runner "waiting" is waiting, not approved`},
		{name: "no files to send", runner: "transfer", start: start(nil), is: []error{app.ErrRefused, app.ErrNoFiles},
			state: app.StateApproved, not: []error{app.ErrNotApproved}, says: "RTE_FILES=transfer"},
		{name: "image the runner does not run", runner: "containers", start: start(func(js *protocol.JobStart) { js.Image = "registry.example/other:1" }),
			is: []error{app.ErrInvalidJob}, not: []error{app.ErrRefused}, says: `runner "containers" does not run registry.example/other:1: its RTE allows rte:dev, registry.example/ee-*`},
		{name: "database mode", runner: "legacy", start: start(nil), is: []error{app.ErrRefused},
			state: app.StateApproved, not: []error{app.ErrNotApproved, app.ErrNoFiles}, says: "database mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := ta.Submit(ctx, app.JobRequest{Runner: tt.runner, JobStart: tt.start})
			if err == nil {
				t.Fatalf("Submit queued job %s, want an error", j.ID)
			}
			for _, want := range tt.is {
				if !errors.Is(err, want) {
					t.Errorf("Submit = %v; errors.Is(err, %q) = false, want true", err, want)
				}
			}
			for _, not := range tt.not {
				if errors.Is(err, not) {
					t.Errorf("Submit = %v; errors.Is(err, %q) = true, want false", err, not)
				}
			}
			var fe *protocol.FieldError
			if got := errors.As(err, &fe); got != (tt.field != "") || (got && fe.Field != tt.field) {
				t.Errorf("Submit = %v; want a *protocol.FieldError for %q, errors.As gave %v (%+v)", err, tt.field, got, fe)
			}
			var re *app.RefusedError
			if got := errors.As(err, &re); got != (tt.state != "") || (got && (re.State != tt.state || re.Runner != tt.runner)) {
				t.Errorf("Submit = %v; want a *app.RefusedError for runner %q in state %q, errors.As gave %v (%+v)", err, tt.runner, tt.state, got, re)
			}
			if !strings.Contains(err.Error(), tt.says) {
				t.Errorf("Submit = %v, want it to say %q", err, tt.says)
			}
		})
	}
	if jobs, err := ta.ListJobs(ctx, app.JobFilter{}); err != nil || len(jobs) != 0 {
		t.Errorf("after only refused submissions the store holds %d jobs (%v), want none", len(jobs), err)
	}
	// What the runner's hello allows is queued; a runner that listed no images (jobs as
	// processes, or not heard since images were stored) leaves the decision to its RTE.
	for runner, image := range map[string]string{"containers": "registry.example/ee-216:1", "rte01": "anything:1"} {
		if _, err := ta.Submit(ctx, app.JobRequest{Runner: runner, JobStart: start(func(js *protocol.JobStart) { js.Image = image })}); err != nil {
			t.Errorf("Submit of image %s to runner %s = %v, want it queued", image, runner, err)
		}
	}
}

// shownOf is what a review page shows of r: everything an admin compares.
func shownOf(r *app.Runner) app.Shown {
	s := app.Shown{TokenFingerprint: r.TokenFingerprint, URL: r.URL, Complete: true}
	if r.PendingCertificate != nil {
		s.CertificateFingerprint = protocol.CertificateFingerprint(r.PendingCertificate)
		s.CertificateSHA256 = protocol.CertificateSHA256(r.PendingCertificate)
	}
	return s
}

// changed asserts that err is a *app.ChangedError for field and returns it.
func changed(t *testing.T, err error, field string) *app.ChangedError {
	t.Helper()
	var ce *app.ChangedError
	if !errors.As(err, &ce) || ce.Field != field || ce.Now == nil {
		t.Fatalf("ApproveShown = %v, want a *app.ChangedError for %s", err, field)
	}
	if cert := strings.HasPrefix(field, "certificate_"); errors.Is(err, app.ErrCertificateChanged) != cert {
		t.Errorf("ApproveShown = %v: errors.Is(err, ErrCertificateChanged) = %v, want %v", err, !cert, cert)
	}
	return ce
}

// TestApproveShownApprovesOnlyWhatWasShown: each value an admin compares that changed since the
// page was drawn (a registration in between) makes ApproveShown approve nothing and say what
// it is now.
func TestApproveShownApprovesOnlyWhatWasShown(t *testing.T) {
	ctx := context.Background()
	ta := newTestApp(t, nil)
	cert1, cert2 := newCert(t), newCert(t)
	if status, _ := ta.register(t, baseRequest(cert1)); status != http.StatusAccepted {
		t.Fatalf("registration got %d, want 202", status)
	}
	shown := shownOf(ta.runner(t, "rte01"))

	// The same RTE registers again with another certificate while the admin reads the page.
	if status, _ := ta.register(t, baseRequest(cert2)); status != http.StatusAccepted {
		t.Fatalf("second registration got %d, want 202", status)
	}
	ce := changed(t, errOf(ta.ApproveShown(ctx, "rte01", shown)), "certificate_fingerprint")
	if !bytes.Equal(ce.Now.PendingCertificate, cert2.der) || !strings.Contains(ce.Error(), protocol.CertificateSHA256(cert2.der)) {
		t.Errorf("the error holds pending %x and says %q; want the new certificate named", ce.Now.PendingCertificate, ce.Error())
	}
	// The full SHA-256 alone binds it too, with the short fingerprint left out (the admin API).
	changed(t, errOf(ta.ApproveShown(ctx, "rte01", app.Shown{CertificateSHA256: shown.CertificateSHA256})), "certificate_sha256")

	// Then it registers at another address.
	shown = shownOf(ta.runner(t, "rte01"))
	req := baseRequest(cert2)
	req.URL = "https://rte01.example.com:9000"
	if status, _ := ta.register(t, req); status != http.StatusAccepted {
		t.Fatalf("third registration got %d, want 202", status)
	}
	if ce := changed(t, errOf(ta.ApproveShown(ctx, "rte01", shown)), "url"); ce.Now.URL != req.URL {
		t.Errorf("the error holds url %q, want %q", ce.Now.URL, req.URL)
	}
	// A page that showed no certificate does not approve one that came to wait since.
	noCert := shownOf(ta.runner(t, "rte01"))
	noCert.CertificateFingerprint, noCert.CertificateSHA256 = "", ""
	changed(t, errOf(ta.ApproveShown(ctx, "rte01", noCert)), "certificate_fingerprint")
	if r := ta.runner(t, "rte01"); r.State != app.StateWaiting || r.Certificate != nil {
		t.Fatalf("after refused approvals the runner is %s with a pin %v, want waiting with none", r.State, r.Certificate != nil)
	}

	// Removed and registered anew with another token: the token fingerprint differs.
	shown = shownOf(ta.runner(t, "rte01"))
	if err := ta.Reject(ctx, "rte01", "test"); err != nil {
		t.Fatal(err)
	}
	req.Token = "another-token-0123456789"
	if status, _ := ta.register(t, req); status != http.StatusAccepted {
		t.Fatalf("registration after the reject got %d, want 202", status)
	}
	if ce := changed(t, errOf(ta.ApproveShown(ctx, "rte01", shown)), "token_fingerprint"); ce.Now.TokenFingerprint != protocol.TokenFingerprint(req.Token) {
		t.Errorf("the error holds token fingerprint %s, want the new one", ce.Now.TokenFingerprint)
	}

	// What is shown now is approved, and the runner comes back as stored.
	r, err := ta.ApproveShown(ctx, "rte01", shownOf(ta.runner(t, "rte01")))
	if err != nil || r.State != app.StateApproved || !bytes.Equal(r.Certificate, cert2.der) || r.URL != req.URL {
		t.Fatalf("ApproveShown of what is shown = %+v, %v; want approved, pinned to the certificate shown", r, err)
	}
	if _, err := ta.ApproveShown(ctx, "nobody", app.Shown{}); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("ApproveShown of an unknown runner = %v, want ErrNotFound", err)
	}
	if _, err := ta.ApproveShown(ctx, "rte01", app.Shown{CertificateSHA256: "abcd-ef12"}); err == nil || !strings.Contains(err.Error(), "is not a full SHA-256") {
		t.Errorf("ApproveShown with a short sha256 = %v, want it refused as not a full SHA-256", err)
	}
}

// TestApproveShownUnderTheLock races registrations that move the runner to another address
// against approvals of what the page showed: an approval that goes through has approved the
// address shown, never the one registered while it ran.
func TestApproveShownUnderTheLock(t *testing.T) {
	ctx := context.Background()
	ta := newTestApp(t, nil)
	cert := newCert(t)
	const moved = "https://rte01.example.com:9000"
	approved, refused := 0, 0
	for i := range 20 {
		req := baseRequest(cert)
		req.Name = fmt.Sprintf("rte%02d", i)
		if status, _ := ta.register(t, req); status != http.StatusAccepted {
			t.Fatalf("registration of %s got %d, want 202", req.Name, status)
		}
		shown := shownOf(ta.runner(t, req.Name))
		req.URL = moved
		var wg sync.WaitGroup
		var regErr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			regErr = postRegistration(ta, req)
		}()
		// Staggered, so that some approvals run before the registration, some during it and
		// some after it.
		time.Sleep(time.Duration(i) * 100 * time.Microsecond)
		r, err := ta.ApproveShown(ctx, req.Name, shown)
		wg.Wait()
		if regErr != nil {
			t.Fatal(regErr)
		}
		switch {
		case err == nil:
			approved++
			if r.URL != shown.URL || !bytes.Equal(r.Certificate, cert.der) {
				t.Fatalf("%s: approved url %q pinned %v, want the url shown (%s) and its certificate", req.Name, r.URL, bytes.Equal(r.Certificate, cert.der), shown.URL)
			}
		default:
			refused++
			if ce := changed(t, err, "url"); ce.Now.URL != moved {
				t.Fatalf("%s: refused with url now %q, want %q", req.Name, ce.Now.URL, moved)
			}
		}
		// Free the waiting slot: one address may hold only a few.
		if err := ta.Reject(ctx, req.Name, "test"); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d approvals went through before the registration, %d were refused after it", approved, refused)
}

// postRegistration registers from a goroutine other than the test's.
func postRegistration(ta *testApp, req protocol.RegisterRequest) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	resp, err := ta.srv.Client().Post(ta.srv.URL+protocol.RegisterPath, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted && resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("registration of %s got %d, want 201 or 202", req.Name, resp.StatusCode)
	}
	return nil
}

// errOf drops ApproveShown's runner, for tests that want only its error.
func errOf(_ *app.Runner, err error) error { return err }
