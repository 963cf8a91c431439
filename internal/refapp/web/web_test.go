package web_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"html"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/refapp/refapptest"
	"github.com/rte-project/rte/internal/refapp/summary"
	"github.com/rte-project/rte/internal/refapp/web"
	"github.com/rte-project/rte/protocol"
)

// webClient is a browser without a browser: it keeps the session cookie and the CSRF token
// and never follows redirects, so a test sees every 303.
type webClient struct {
	t      *testing.T
	base   string
	cookie *http.Cookie
	csrf   string
	header http.Header // added to every request (X-Forwarded-Proto, Host...)
}

func newWebClient(t *testing.T, ta *refapptest.App) *webClient {
	return &webClient{t: t, base: ta.URL, header: http.Header{}}
}

// webAnswer is one answer, its body read.
type webAnswer struct {
	status int
	header http.Header
	body   string
}

func (c *webClient) do(method, path string, form url.Values) webAnswer {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range c.header {
		if k == "Host" {
			req.Host = v[0]
			continue
		}
		req.Header[k] = v
	}
	if c.cookie != nil {
		req.AddCookie(&http.Cookie{Name: c.cookie.Name, Value: c.cookie.Value})
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return webAnswer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (c *webClient) get(path string) webAnswer {
	c.t.Helper()
	return c.do(http.MethodGet, path, nil)
}

// post sends a form with the session's CSRF token, unless the form sets csrf itself.
func (c *webClient) post(path string, form url.Values) webAnswer {
	c.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	if _, ok := form[web.CSRFField]; !ok {
		form.Set(web.CSRFField, c.csrf)
	}
	return c.do(http.MethodPost, path, form)
}

var csrfInput = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// signIn signs in with the admin token and reads the CSRF token off the runners page.
func (c *webClient) signIn() {
	c.t.Helper()
	a := c.do(http.MethodPost, "/signin", url.Values{"token": {refapptest.AdminToken}, "next": {"/runners"}})
	if a.status != http.StatusSeeOther || a.header.Get("Location") != "/runners" {
		c.t.Fatalf("sign in: got %d Location %q, want 303 to /runners; body:\n%s", a.status, a.header.Get("Location"), a.body)
	}
	c.cookie = sessionCookieOf(c.t, a.header)
	page := c.get("/runners")
	m := csrfInput.FindStringSubmatch(page.body)
	if page.status != http.StatusOK || m == nil {
		c.t.Fatalf("GET /runners after sign-in: got %d without a csrf field, want 200 with one:\n%s", page.status, page.body)
	}
	c.csrf = m[1]
}

func sessionCookieOf(t *testing.T, h http.Header) *http.Cookie {
	t.Helper()
	for _, line := range h.Values("Set-Cookie") {
		c, err := http.ParseSetCookie(line)
		if err == nil && (c.Name == web.CookiePlain || c.Name == web.CookieSecure) {
			return c
		}
	}
	t.Fatalf("no session cookie among Set-Cookie %q", h.Values("Set-Cookie"))
	return nil
}

func signedIn(t *testing.T, ta *refapptest.App) *webClient {
	t.Helper()
	c := newWebClient(t, ta)
	c.signIn()
	return c
}

func TestWebSendsStrangersToSignIn(t *testing.T) {
	ta := refapptest.StartApp(t)
	c := newWebClient(t, ta)
	cases := []struct{ method, path, next string }{
		{"GET", "/", "/"},
		{"GET", "/runners", "/runners"},
		{"GET", "/runners/r1", "/runners/r1"},
		{"GET", "/jobs?runner=r1", "/jobs?runner=r1"},
		{"GET", "/jobs/0123", "/jobs/0123"},
		{"GET", "/jobs/0123/summary", "/jobs/0123/summary"},
		{"GET", "/jobs/0123/stream", "/jobs/0123/stream"},
		{"GET", "/no/such/page", "/no/such/page"},
		{"POST", "/jobs", "/runners"},
		{"POST", "/runners/r1/approve", "/runners"},
		{"POST", "/runners/r1/reject", "/runners"},
		{"POST", "/jobs/0123/cancel", "/runners"},
		{"POST", "/signout", "/runners"},
	}
	for _, tc := range cases {
		for _, cookie := range []*http.Cookie{nil, {Name: web.CookiePlain, Value: strings.Repeat("ab", 32)}} {
			c.cookie = cookie
			a := c.do(tc.method, tc.path, url.Values{"csrf": {"x"}})
			want := "/signin?next=" + url.QueryEscape(tc.next)
			if a.status != http.StatusSeeOther || a.header.Get("Location") != want {
				t.Errorf("%s %s (cookie %v): got %d Location %q, want 303 to %s", tc.method, tc.path, cookie != nil, a.status, a.header.Get("Location"), want)
			}
			if cookie != nil && !strings.Contains(a.header.Get("Set-Cookie"), "Max-Age=0") {
				t.Errorf("%s %s with an unknown session: Set-Cookie %q, want the cookie cleared", tc.method, tc.path, a.header.Get("Set-Cookie"))
			}
		}
	}
	// Nothing was changed by any of them.
	if status, body := ta.Call(t, "GET", "/api/v2/runners", ""); status != 200 || !strings.Contains(string(body), `"state":"approved"`) {
		t.Errorf("runner r1 after the refused posts: %d %s, want it still approved", status, body)
	}
}

func TestWebSignIn(t *testing.T) {
	ta := refapptest.StartApp(t)
	t.Run("wrong tokens are refused", func(t *testing.T) {
		for _, token := range []string{"", "x", strings.Repeat("x", len(refapptest.AdminToken)), refapptest.AdminToken[1:], refapptest.AdminToken + "x", strings.ToUpper(refapptest.AdminToken)} {
			c := newWebClient(t, ta)
			a := c.do(http.MethodPost, "/signin", url.Values{"token": {token}})
			if a.status != http.StatusUnauthorized || !strings.Contains(a.body, "That is not the admin token") {
				t.Errorf("sign in with %q: got %d, want 401 saying it is not the admin token:\n%s", token, a.status, a.body)
			}
			if sc := a.header.Values("Set-Cookie"); len(sc) > 0 {
				t.Errorf("sign in with %q: Set-Cookie %q, want no cookie", token, sc)
			}
		}
		if !strings.Contains(ta.Logs.String(), "sign-in refused: wrong admin token") {
			t.Errorf("the log does not record the refused sign-ins:\n%s", ta.Logs.String())
		}
	})
	t.Run("plain http on loopback", func(t *testing.T) {
		c := newWebClient(t, ta)
		a := c.do(http.MethodPost, "/signin", url.Values{"token": {refapptest.AdminToken}, "next": {"/jobs?runner=r1"}})
		if a.status != http.StatusSeeOther || a.header.Get("Location") != "/jobs?runner=r1" {
			t.Fatalf("sign in: got %d Location %q, want 303 back to /jobs?runner=r1", a.status, a.header.Get("Location"))
		}
		raw := a.header.Get("Set-Cookie")
		ck := sessionCookieOf(t, a.header)
		if ck.Name != web.CookiePlain || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.Secure || ck.Domain != "" || len(ck.Value) != 64 {
			t.Errorf("session cookie %q: want %s, HttpOnly, SameSite=Strict, Path=/, no Domain, not Secure on plain loopback http, a 64-digit id", raw, web.CookiePlain)
		}
		c.cookie = ck
		if a := c.get("/runners"); a.status != http.StatusOK || !strings.Contains(a.body, `data-runner="r1"`) {
			t.Errorf("GET /runners with the cookie: got %d, want 200 listing r1", a.status)
		}
		if strings.Contains(ta.Logs.String(), ck.Value) {
			t.Errorf("the session id reached the log")
		}
	})
	t.Run("over TLS at the proxy", func(t *testing.T) {
		c := newWebClient(t, ta)
		c.header.Set("X-Forwarded-Proto", "https")
		c.header.Set("Host", "rte-app.example.com")
		a := c.do(http.MethodPost, "/signin", url.Values{"token": {refapptest.AdminToken}})
		if a.status != http.StatusSeeOther {
			t.Fatalf("sign in over https: got %d, want 303:\n%s", a.status, a.body)
		}
		ck := sessionCookieOf(t, a.header)
		if ck.Name != web.CookieSecure || !ck.Secure || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" {
			t.Errorf("session cookie over https %q: want %s, Secure, HttpOnly, SameSite=Strict, Path=/", a.header.Get("Set-Cookie"), web.CookieSecure)
		}
		if sts := a.header.Get("Strict-Transport-Security"); sts == "" {
			t.Errorf("no Strict-Transport-Security over https")
		}
		c.cookie = ck
		if a := c.get("/runners"); a.status != http.StatusOK {
			t.Errorf("GET /runners over https with the cookie: got %d, want 200", a.status)
		}
	})
	t.Run("plain http elsewhere is refused", func(t *testing.T) {
		c := newWebClient(t, ta)
		c.header.Set("Host", "rte-app.example.com:8080")
		if a := c.get("/signin"); !strings.Contains(a.body, "signing in is refused") {
			t.Errorf("GET /signin over plain http at a public name does not warn:\n%s", a.body)
		}
		a := c.do(http.MethodPost, "/signin", url.Values{"token": {refapptest.AdminToken}})
		if a.status != http.StatusForbidden || !strings.Contains(a.body, "Signing in over plain HTTP is refused") || len(a.header.Values("Set-Cookie")) > 0 {
			t.Errorf("sign in over plain http at a public name: got %d, cookies %q, want 403 without a cookie:\n%s", a.status, a.header.Values("Set-Cookie"), a.body)
		}
	})
	t.Run("a form from another site is refused", func(t *testing.T) {
		c := newWebClient(t, ta)
		c.header.Set("Sec-Fetch-Site", "cross-site")
		a := c.do(http.MethodPost, "/signin", url.Values{"token": {refapptest.AdminToken}})
		if a.status != http.StatusForbidden || len(a.header.Values("Set-Cookie")) > 0 {
			t.Errorf("sign in from another site: got %d, cookies %q, want 403 without a cookie", a.status, a.header.Values("Set-Cookie"))
		}
		s := signedIn(t, ta)
		s.header.Set("Sec-Fetch-Site", "cross-site")
		if a := s.post("/runners/r1/reject", nil); a.status != http.StatusForbidden {
			t.Errorf("a post from another site with a valid csrf token: got %d, want 403", a.status)
		}
	})
	t.Run("a signed-in admin skips the form", func(t *testing.T) {
		c := signedIn(t, ta)
		if a := c.get("/signin?next=/jobs"); a.status != http.StatusSeeOther || a.header.Get("Location") != "/jobs" {
			t.Errorf("GET /signin when signed in: got %d Location %q, want 303 to /jobs", a.status, a.header.Get("Location"))
		}
	})
}

func TestWebStaticAssets(t *testing.T) {
	ta := refapptest.StartApp(t)
	c := newWebClient(t, ta)
	for path, ctype := range map[string]string{"/static/app.css": "text/css", "/static/job.js": "text/javascript", "/static/favicon.svg": "image/svg+xml"} {
		if a := c.get(path); a.status != http.StatusOK || !strings.HasPrefix(a.header.Get("Content-Type"), ctype) {
			t.Errorf("GET %s without a session: got %d %s, want 200 %s", path, a.status, a.header.Get("Content-Type"), ctype)
		}
	}
	for _, path := range []string{"/static/", "/static/nope.css"} {
		if a := c.get(path); a.status != http.StatusNotFound {
			t.Errorf("GET %s: got %d, want 404", path, a.status)
		}
	}
}

func TestWebSignOut(t *testing.T) {
	ta := refapptest.StartApp(t)
	c := signedIn(t, ta)
	a := c.post("/signout", nil)
	if a.status != http.StatusSeeOther || a.header.Get("Location") != "/signin?signed_out" {
		t.Fatalf("sign out: got %d Location %q, want 303 to /signin?signed_out", a.status, a.header.Get("Location"))
	}
	if ck := sessionCookieOf(t, a.header); ck.MaxAge >= 0 {
		t.Errorf("sign out: cookie %q, want it cleared", a.header.Get("Set-Cookie"))
	}
	// The old id is dead on the server, whatever the browser kept.
	if a := c.get("/runners"); a.status != http.StatusSeeOther {
		t.Errorf("GET /runners with the signed-out id: got %d, want 303 to sign in", a.status)
	}
}

func TestWebSecurityHeaders(t *testing.T) {
	ta := refapptest.StartApp(t)
	c := signedIn(t, ta)
	job := ta.Submit(t, `{"runner":"r1","playbook":"site.yml"}`)
	for _, path := range []string{"/signin", "/runners", "/runners/r1", "/jobs", "/jobs/" + job.ID, "/jobs/nope", "/static/app.css", "/static/job.js"} {
		a := c.get(path)
		if path == "/signin" {
			a = newWebClient(t, ta).get(path)
		}
		h := a.header
		csp := h.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'", "form-action 'self'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("GET %s: Content-Security-Policy %q lacks %q", path, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
			t.Errorf("GET %s: Content-Security-Policy %q allows inline code", path, csp)
		}
		for k, want := range map[string]string{"X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff"} {
			if got := h.Get(k); got != want {
				t.Errorf("GET %s: %s %q, want %q", path, k, got, want)
			}
		}
		if strings.HasSuffix(path, ".css") || strings.HasSuffix(path, ".js") {
			continue
		}
		// The pages obey their own policy: no inline script, no style attributes.
		if strings.Contains(a.body, "<script>") || strings.Contains(a.body, " style=") || strings.Contains(a.body, " onclick=") {
			t.Errorf("GET %s: the page has inline script or style, which its CSP blocks", path)
		}
		if h.Get("Cache-Control") != "no-store" {
			t.Errorf("GET %s: Cache-Control %q, want no-store", path, h.Get("Cache-Control"))
		}
	}
}

func TestWebRefusesPostsWithoutTheCSRFToken(t *testing.T) {
	ta := refapptest.StartApp(t)
	c := signedIn(t, ta)
	other := signedIn(t, ta) // another session: its token is valid, but not for c
	queued := ta.Submit(t, `{"runner":"r1","playbook":"site.yml"}`)
	jobsBefore := countJobs(t, ta)
	posts := []struct {
		path string
		form url.Values
	}{
		{"/jobs", url.Values{"runner": {"r1"}, "playbook": {"site.yml"}}},
		{"/runners/r1/reject", url.Values{"reason": {"csrf"}}},
		{"/runners/r1/approve", url.Values{"token_fingerprint": {protocol.TokenFingerprint(refapptest.RunnerToken)}}},
		{"/jobs/" + queued.ID + "/cancel", nil},
		{"/signout", nil},
	}
	tokens := map[string][]string{
		"missing":             nil,
		"empty":               {""},
		"wrong":               {strings.Repeat("0", len(c.csrf))},
		"another session's":   {other.csrf},
		"the session's twice": {c.csrf + c.csrf},
	}
	for _, p := range posts {
		for name, tok := range tokens {
			form := url.Values{}
			for k, v := range p.form {
				form[k] = v
			}
			if tok != nil {
				form[web.CSRFField] = tok
			}
			a := c.do(http.MethodPost, p.path, form)
			if a.status != http.StatusForbidden || !strings.Contains(a.body, "nothing was changed") {
				t.Errorf("POST %s with a %s csrf token: got %d, want 403 saying nothing was changed:\n%s", p.path, name, a.status, a.body)
			}
		}
	}
	// Nothing changed: the runner, the job and the session are as they were.
	if j, err := ta.App.GetJob(context.Background(), queued.ID); err != nil || j.State != app.JobQueued {
		t.Errorf("job after the refused cancels: %+v %v, want still queued", j, err)
	}
	if n := countJobs(t, ta); n != jobsBefore {
		t.Errorf("jobs after the refused starts: %d, want %d", n, jobsBefore)
	}
	if rs, err := ta.App.ListRunners(context.Background()); err != nil || len(rs) != 1 || rs[0].State != app.StateApproved {
		t.Errorf("runners after the refused rejects: %v %v, want r1 still approved", rs, err)
	}
	if a := c.get("/runners"); a.status != http.StatusOK {
		t.Errorf("GET /runners after the refused sign-outs: %d, want 200: the session must still be there", a.status)
	}
}

func countJobs(t *testing.T, ta *refapptest.App) int {
	t.Helper()
	jobs, err := ta.App.ListJobs(context.Background(), app.JobFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return len(jobs)
}

func TestWebStartJob(t *testing.T) {
	ta := refapptest.StartApp(t)
	c := signedIn(t, ta)
	if a := c.get("/jobs"); !strings.Contains(a.body, `<option value="r1"`) {
		t.Fatalf("GET /jobs: the form does not offer runner r1:\n%s", a.body)
	}
	bad := []struct {
		name   string
		form   url.Values
		status int
		want   string // the page says this
		field  string // and marks this field
	}{
		{"extra vars not json", url.Values{"runner": {"r1"}, "playbook": {"site.yml"}, "extravars": {`{"version": `}}, 400, "Extravars: not valid JSON", "extravars"},
		{"extra vars not an object", url.Values{"runner": {"r1"}, "playbook": {"site.yml"}, "extravars": {`[1, 2]`}}, 400, "Extravars: must be a JSON object", "extravars"},
		{"unknown runner", url.Values{"runner": {"nope"}, "playbook": {"site.yml"}}, 400, `Runner: no runner named "nope"`, "runner"},
		{"no runner", url.Values{"playbook": {"site.yml"}}, 400, "Runner: is required", "runner"},
		{"missing playbook", url.Values{"runner": {"r1"}, "playbook": {"  "}}, 400, "Playbook: is required", "playbook"},
	}
	for _, tc := range bad {
		before := countJobs(t, ta)
		tc.form.Set("inventories", "hosts.yml\n<b>kept</b>")
		a := c.post("/jobs", tc.form)
		if a.status != tc.status || !strings.Contains(html.UnescapeString(a.body), tc.want) {
			t.Errorf("%s: got %d, want %d with a message saying %q:\n%s", tc.name, a.status, tc.status, tc.want, a.body)
			continue
		}
		if !regexp.MustCompile(`class="field[^"]* invalid">\s*<label for="` + tc.field + `"`).MatchString(a.body) {
			t.Errorf("%s: the page does not mark the %s field", tc.name, tc.field)
		}
		if !strings.Contains(a.body, "hosts.yml\n&lt;b&gt;kept&lt;/b&gt;") {
			t.Errorf("%s: the page does not keep what was typed (escaped)", tc.name)
		}
		if strings.Contains(a.body, "goroutine ") || strings.Contains(a.body, ".go:") {
			t.Errorf("%s: the page shows a stack trace:\n%s", tc.name, a.body)
		}
		if n := countJobs(t, ta); n != before {
			t.Errorf("%s: %d jobs after the refusal, want %d", tc.name, n, before)
		}
	}

	a := c.post("/jobs", url.Values{"runner": {"r1"}, "playbook": {"site.yml"}, "inventories": {"hosts.yml\n\n extra.yml "},
		"extravars": {`{"version": "1.2"}`}, "limit": {"web*"}, "check": {"1"}})
	loc := a.header.Get("Location")
	if a.status != http.StatusSeeOther || !strings.HasPrefix(loc, "/jobs/") {
		t.Fatalf("start a job: got %d Location %q, want 303 to the job's page:\n%s", a.status, loc, a.body)
	}
	j, err := ta.App.GetJob(context.Background(), strings.TrimPrefix(loc, "/jobs/"))
	if err != nil {
		t.Fatal(err)
	}
	s := j.Start
	if j.Runner != "r1" || s.Playbook != "site.yml" || strings.Join(s.Inventories, ",") != "hosts.yml,extra.yml" ||
		!jsonEqual(s.Extravars, `{"version": "1.2"}`) || s.Limit != "web*" || !s.Check {
		t.Errorf("the job started: %+v, want the form's values", j)
	}
	if page := c.get(loc); page.status != http.StatusOK || !strings.Contains(page.body, `data-live="true"`) || !strings.Contains(page.body, `id="cancel-job"`) {
		t.Errorf("GET %s: got %d, want a live page with a cancel button:\n%s", loc, page.status, page.body)
	}
}

func TestWebNotFoundPages(t *testing.T) {
	ta := refapptest.StartApp(t)
	c := signedIn(t, ta)
	cases := []struct{ method, path, want string }{
		{"GET", "/runners/nope", `There is no runner named "nope"`},
		{"GET", "/runners/" + url.PathEscape("a b/c"), `There is no runner named "a b/c"`},
		{"GET", "/jobs/nope", `There is no job "nope"`},
		{"GET", "/jobs/nope/summary", `There is no job "nope"`},
		{"GET", "/no/such/page", "There is no page at /no/such/page"},
		{"POST", "/runners/nope/approve", `There is no runner named "nope"`},
		{"POST", "/runners/nope/reject", `There is no runner named "nope"`},
		{"POST", "/jobs/nope/cancel", `There is no job "nope"`},
	}
	for _, tc := range cases {
		var a webAnswer
		if tc.method == "POST" {
			a = c.post(tc.path, url.Values{"token_fingerprint": {"x"}})
		} else {
			a = c.get(tc.path)
		}
		if a.status != http.StatusNotFound || !strings.HasPrefix(a.header.Get("Content-Type"), "text/html") ||
			!strings.Contains(html.UnescapeString(a.body), tc.want) || !strings.Contains(a.body, "<html") {
			t.Errorf("%s %s: got %d %s, want a 404 page saying %q:\n%s", tc.method, tc.path, a.status, a.header.Get("Content-Type"), tc.want, a.body)
		}
	}
}

// certPEM makes a self-signed certificate as an RTE would, returning its PEM and DER.
func certPEM(t *testing.T, host string) (string, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host, "localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), der
}

// register posts a registration as an RTE does and returns the status.
func register(t *testing.T, ta *refapptest.App, name, rteURL, token, cert string) int {
	t.Helper()
	b, err := json.Marshal(protocol.RegisterRequest{Name: name, URL: rteURL, Token: token, Certificate: cert, Version: "1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	status, body := ta.CallAs(t, http.MethodPost, protocol.RegisterPath, string(b), "")
	if status >= 500 {
		t.Fatalf("register %s: %d %s", name, status, body)
	}
	return status
}

func TestWebReviewAndApprove(t *testing.T) {
	ta := refapptest.StartApp(t)
	c := signedIn(t, ta)
	const name = "edge rte/01" // a space and a slash: every link must escape it
	const token = "edge-runner-token-0123456789abcdef"
	rteURL := "https://rte01.example.com:8000"
	pemText, der := certPEM(t, "rte01.example.com")
	if status := register(t, ta, name, rteURL, token, pemText); status != http.StatusAccepted {
		t.Fatalf("registration: %d, want 202 waiting", status)
	}
	page := "/runners/" + url.PathEscape(name)

	list := c.get("/runners")
	if !strings.Contains(list.body, `id="waiting-notice"`) || !strings.Contains(list.body, "1 runner</strong>") && !strings.Contains(list.body, "1 runner waits for approval") {
		t.Errorf("GET /runners: no notice that one runner waits:\n%s", list.body)
	}
	if !strings.Contains(list.body, `href="`+page+`"`) {
		t.Errorf("GET /runners: no link to %s", page)
	}

	review := c.get(page)
	tokenFP, certFP, sha := protocol.TokenFingerprint(token), protocol.CertificateFingerprint(der), protocol.CertificateSHA256(der)
	for _, want := range []string{
		`id="token-fp">` + tokenFP + `<`, `<code class="fp">` + certFP + `</code>`, sha, "<summary>Full SHA-256</summary>",
		`id="request-ip">127.0.0.1<`, "rte01.example.com:8000", "1.2.3", "rte starting", "Approve only if they are the same",
	} {
		if !strings.Contains(review.body, want) {
			t.Errorf("GET %s: the review lacks %q:\n%s", page, want, review.body)
		}
	}
	if strings.Contains(review.body, token) {
		t.Errorf("GET %s: the page shows the runner's token", page)
	}

	form := url.Values{"token_fingerprint": {tokenFP}, "certificate_fingerprint": {certFP}, "url": {rteURL}}
	refusals := []struct {
		name, field, value, want string
	}{
		{"another certificate", "certificate_fingerprint", "0000-0000", "registered again with another certificate"},
		{"no certificate shown", "certificate_fingerprint", "", "registered again with another certificate"},
		// Issue 10: the short fingerprint is 32 bits; the full SHA-256 the page showed binds.
		{"another certificate with the same short fingerprint", "certificate_sha256", strings.Repeat("0", 64), "registered again with another certificate"},
		{"another token", "token_fingerprint", "ffff-ffff", "registered again with another token"},
		{"another address", "url", "https://elsewhere:8000", "registered again with another address"},
	}
	for _, tc := range refusals {
		f := url.Values{}
		for k, v := range form {
			f[k] = v
		}
		f.Set(tc.field, tc.value)
		a := c.post(page+"/approve", f)
		if a.status != http.StatusConflict || !strings.Contains(a.body, tc.want) || !strings.Contains(a.body, "Nothing was approved") {
			t.Errorf("approve with %s: got %d, want 409 saying %q:\n%s", tc.name, a.status, tc.want, a.body)
		}
	}
	if rn := ta.Runner(t, name); rn.State != app.StateWaiting {
		t.Fatalf("after the refused approvals the runner is %s, want waiting", rn.State)
	}

	a := c.post(page+"/approve", form)
	if a.status != http.StatusSeeOther || a.header.Get("Location") != "/runners" {
		t.Fatalf("approve: got %d Location %q, want 303 to /runners:\n%s", a.status, a.header.Get("Location"), a.body)
	}
	rn := ta.Runner(t, name)
	if rn.State != app.StateApproved || protocol.CertificateSHA256(rn.Certificate) != sha {
		t.Fatalf("after approving: state %s, pinned %x, want approved with the certificate shown", rn.State, rn.Certificate)
	}
	if list := c.get("/runners"); !strings.Contains(list.body, "Approved "+html.EscapeString(name)) || strings.Contains(list.body, `id="waiting-notice"`) {
		t.Errorf("GET /runners after approving: want the flash and no waiting notice:\n%s", list.body)
	}

	// The RTE comes back with a new certificate: both are shown, old (pinned) and new.
	newPEM, newDER := certPEM(t, "rte01.example.com")
	if status := register(t, ta, name, rteURL, token, newPEM); status != http.StatusConflict {
		t.Fatalf("registration with a new certificate: %d, want 409 (waits for an admin)", status)
	}
	review = c.get(page)
	pinned := regexp.MustCompile(`(?s)id="pinned-cert">.*?<code class="fp">([0-9a-f-]+)</code>`).FindStringSubmatch(review.body)
	waiting := regexp.MustCompile(`(?s)id="cert">.*?<code class="fp">([0-9a-f-]+)</code>`).FindStringSubmatch(review.body)
	if !strings.Contains(review.body, `id="cert-changed"`) || pinned == nil || waiting == nil ||
		pinned[1] != certFP || waiting[1] != protocol.CertificateFingerprint(newDER) {
		t.Errorf("GET %s after a certificate change: want the warning, pinned %s and new %s:\n%s", page, certFP, protocol.CertificateFingerprint(newDER), review.body)
	}

	a = c.post(page+"/reject", url.Values{"reason": {"not ours"}})
	if a.status != http.StatusSeeOther {
		t.Fatalf("reject: got %d, want 303:\n%s", a.status, a.body)
	}
	if a := c.get(page); a.status != http.StatusNotFound {
		t.Errorf("GET %s after rejecting: %d, want 404", page, a.status)
	}
}

func TestWebJobPageReadsTheStore(t *testing.T) {
	ta := refapptest.StartApp(t)
	c := signedIn(t, ta)
	job := ta.Submit(t, `{"runner":"r1","playbook":"site.yml","inventories":["hosts.yml"]}`)
	events := refapptest.ReadEvents(t, filepath.Join("..", "summary", "testdata", "site.events.jsonl"))
	ta.StoreRecords(t, job.ID,
		refapptest.Record(t, 1, protocol.KindStart, protocol.StartData{PID: 42, Instance: "rte-test", Playbook: "site.yml"}),
		refapptest.Record(t, 2, protocol.KindOutput, protocol.OutputData{Text: "PLAY [Demo play] ***\n<script>alert(1)</script>\n"}),
		refapptest.Record(t, 3, protocol.KindEvents, protocol.EventsData{Events: events}),
		refapptest.Record(t, 4, protocol.KindLog, protocol.LogData{Level: "warn", Message: "a note from the RTE"}),
	)
	a := c.get("/jobs/" + job.ID)
	for _, want := range []string{
		"PLAY [Demo play] ***\n&lt;script&gt;alert(1)&lt;/script&gt;", `<span class="note note-warn">rte warn: a note from the RTE`,
		`data-task="Gathering Facts"`, `data-task="Write the greeting"`, `id="recap"`, `<td class="strong">localhost</td>`,
		`class="badge r-changed">changed<`, `data-after="4"`, `class="bar"`, `id="slowest"`,
	} {
		if !strings.Contains(a.body, want) {
			t.Errorf("GET /jobs/%s lacks %q:\n%s", job.ID, want, a.body)
		}
	}
	if strings.Contains(a.body, "<script>alert") {
		t.Errorf("GET /jobs/%s: output reached the page unescaped", job.ID)
	}
	frag := c.get("/jobs/" + job.ID + "/summary")
	if frag.status != http.StatusOK || strings.Contains(frag.body, "<html") || !strings.Contains(frag.body, `data-task="Write the greeting"`) {
		t.Errorf("GET /jobs/%s/summary: got %d, want the Hosts and tasks fragment alone:\n%s", job.ID, frag.status, frag.body)
	}

	// Cancel from the page: the queued job ends at once; a second cancel finds it ended.
	if a := c.post("/jobs/"+job.ID+"/cancel", nil); a.status != http.StatusSeeOther || a.header.Get("Location") != "/jobs/"+job.ID {
		t.Fatalf("cancel: got %d Location %q, want 303 to the job", a.status, a.header.Get("Location"))
	}
	page := c.get("/jobs/" + job.ID)
	if !strings.Contains(page.body, `id="job-state">canceled<`) || !strings.Contains(page.body, `data-live="false"`) || strings.Contains(page.body, `id="cancel-job"`) {
		t.Errorf("job page after cancel: want canceled, not live, no cancel button:\n%s", page.body)
	}
	if a := c.post("/jobs/"+job.ID+"/cancel", nil); a.status != http.StatusSeeOther {
		t.Errorf("second cancel: got %d, want 303 back to the job", a.status)
	}
	if page := c.get("/jobs/" + job.ID); !strings.Contains(page.body, "had already ended") {
		t.Errorf("after a second cancel the page does not say the job had already ended:\n%s", page.body)
	}
}

func TestWebStreamNeedsTheSession(t *testing.T) {
	ta := refapptest.StartApp(t)
	c := signedIn(t, ta)
	job := ta.Submit(t, `{"runner":"r1","playbook":"site.yml"}`)
	ta.StoreRecords(t, job.ID, refapptest.Record(t, 1, protocol.KindOutput, protocol.OutputData{Text: "hello\n"}))
	if err := ta.App.Cancel(context.Background(), job.ID); err != nil {
		t.Fatal(err)
	}
	a := c.get("/jobs/" + job.ID + "/stream")
	if a.status != http.StatusOK || !strings.HasPrefix(a.header.Get("Content-Type"), "text/event-stream") ||
		!strings.Contains(a.body, `"text":"hello\n"`) || !strings.Contains(a.body, "event: job") {
		t.Errorf("GET the page's stream: got %d %s, want the records and the ended job:\n%s", a.status, a.header.Get("Content-Type"), a.body)
	}
}

func TestSummaryViewTimeline(t *testing.T) {
	v := web.NewSummaryView(summary.Summarize(refapptest.ReadEvents(t, filepath.Join("..", "summary", "testdata", "site.events.jsonl"))), time.Time{})
	if v.Slowest == "" || v.Span == "" {
		t.Fatalf("summary view of the example run: slowest %q span %q, want both", v.Slowest, v.Span)
	}
	slow := 0
	for _, p := range v.Plays {
		for _, task := range p.Tasks {
			var x, w float64
			if _, err := fmt.Sscan(task.X, &x); err != nil {
				t.Fatal(err)
			}
			if _, err := fmt.Sscan(task.W, &w); err != nil {
				t.Fatal(err)
			}
			if x < 0 || w <= 0 || x+w > 1000.05 {
				t.Errorf("task %q bar at %s width %s, want inside 0..1000", task.Name, task.X, task.W)
			}
			if task.Slow {
				slow++
				if task.Name != v.Slowest {
					t.Errorf("task %q is marked slow, but the slowest is %q", task.Name, v.Slowest)
				}
			}
			if task.Duration > 0 && len(task.Hosts) == 0 {
				t.Errorf("task %q has a duration and no hosts", task.Name)
			}
		}
	}
	if slow != 1 {
		t.Errorf("%d tasks marked slow, want 1", slow)
	}
	failures := web.NewSummaryView(summary.Summarize(refapptest.ReadEvents(t, filepath.Join("..", "summary", "testdata", "failures.events.jsonl"))), time.Time{})
	notes := ""
	for _, p := range failures.Plays {
		for _, task := range p.Tasks {
			for _, h := range task.Hosts {
				notes += h.Notes + "\n"
			}
		}
	}
	if !strings.Contains(notes, "failure ignored") {
		t.Errorf("host notes of the failures run lack the ignored failure:\n%s", notes)
	}
}

func jsonEqual(got json.RawMessage, want string) bool {
	var a, b any
	return json.Unmarshal(got, &a) == nil && json.Unmarshal([]byte(want), &b) == nil && fmt.Sprint(a) == fmt.Sprint(b)
}

// TestWebClearWaiting: the runners page rejects every waiting request at once (issue 10: one
// caller could hold every waiting slot for a day); approved runners are kept, and a post
// without the CSRF token changes nothing.
func TestWebClearWaiting(t *testing.T) {
	ta := refapptest.StartApp(t)
	c := signedIn(t, ta)
	for i, name := range []string{"stranger-1", "stranger-2"} {
		pemText, _ := certPEM(t, "rte01.example.com")
		if status := register(t, ta, name, "https://rte01.example.com:8000", fmt.Sprintf("stranger-token-%d-0123456789abcdef", i), pemText); status != http.StatusAccepted {
			t.Fatalf("registration of %s: %d, want 202 waiting", name, status)
		}
	}
	if list := c.get("/runners"); !strings.Contains(list.body, `id="clear-waiting"`) {
		t.Fatalf("GET /runners with waiting requests: no clear-waiting form:\n%s", list.body)
	}
	if a := c.post("/runners/clear-waiting", url.Values{"csrf": {"0000"}}); a.status != http.StatusForbidden {
		t.Fatalf("clear-waiting with a wrong csrf token: %d, want 403", a.status)
	}
	if rn := ta.Runner(t, "stranger-1"); rn.State != app.StateWaiting {
		t.Fatalf("stranger-1 is %s after a refused clear, want waiting", rn.State)
	}
	if a := c.post("/runners/clear-waiting", url.Values{}); a.status != http.StatusSeeOther {
		t.Fatalf("clear-waiting: %d, want 303", a.status)
	}
	page := c.get("/runners")
	if !strings.Contains(page.body, "Rejected 2 waiting requests") || strings.Contains(page.body, `id="waiting-notice"`) {
		t.Fatalf("after the clear the page does not say so, or still shows waiting runners:\n%s", page.body)
	}
	if rn := ta.Runner(t, "r1"); rn.State != app.StateApproved {
		t.Fatalf("approved runner r1 is %s after the clear, want kept", rn.State)
	}
}
