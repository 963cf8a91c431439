package web

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/display"
)

// The admin page: Connections > Runners (with the approval review), Jobs (start, follow live,
// cancel), served by rte-app itself from templates and assets embedded in the binary. It signs
// in with APP_ADMIN_TOKEN and then works on a server-side session (websession.go); every POST
// carries the session's CSRF token. It decides nothing itself: approval, dispatch and storage
// go through the same code as the admin API (package api), so the page and the API refuse the same
// things with the same words. docs/admin-page.md describes it.

//go:embed templates static
var webFiles embed.FS

// maxPageOutput bounds the output a job page shows: the tail of a long run, since that is
// where a failure is. GET /api/v2/jobs/{id}/records has all of it.
const maxPageOutput = 1 << 20

// recordsPage is how many records the page reads from the store at a time.
const recordsPage = 1000

// contentSecurityPolicy lets a page load scripts, styles and images from the app only, with
// no inline script or style, talk to the app only (the live stream, the summary fragment),
// post forms to the app only, and never be framed.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// web serves the admin page on top of the admin API's handlers.
type web struct {
	api      *api.API
	log      *zap.Logger
	sessions *sessionStore
	pages    map[string]*template.Template
	static   http.Handler
	now      func() time.Time
}

// webPages are the templates, each parsed with the layout and the shared fragments. A
// template that does not parse is a build mistake that every test catches.
var webPages = parsePages("signin.html", "runners.html", "runner.html", "jobs.html", "job.html", "error.html")

func parsePages(names ...string) map[string]*template.Template {
	pages := map[string]*template.Template{}
	for _, name := range names {
		t := template.New(name).Funcs(webFuncs)
		pages[name] = template.Must(t.ParseFS(webFiles, "templates/layout.html", "templates/parts.html", "templates/"+name))
	}
	return pages
}

// New returns the admin page over h: every route but /api/ and the protocol's.
func New(h *api.API) http.Handler {
	return newWeb(h).routes()
}

func newWeb(h *api.API) *web {
	static, err := fs.Sub(webFiles, "static")
	if err != nil {
		panic(err) // the embed pattern names static, so it is there
	}
	return &web{
		api:      h,
		log:      h.Logger().Named("web"),
		sessions: newSessionStore(time.Now),
		pages:    webPages,
		static:   http.StripPrefix("/static/", http.FileServerFS(static)),
		now:      time.Now,
	}
}

func (wb *web) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /static/", func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // no directory listings
			return
		}
		wb.static.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /signin", wb.signinPage)
	mux.HandleFunc("POST /signin", wb.signin)
	mux.Handle("POST /signout", wb.guard(wb.signout))
	mux.Handle("GET /{$}", wb.guard(func(w http.ResponseWriter, r *http.Request, _ visit) {
		http.Redirect(w, r, "/runners", http.StatusSeeOther)
	}))
	mux.Handle("GET /runners", wb.guard(wb.runnersPage))
	mux.Handle("GET /runners/{name}", wb.guard(wb.runnerPage))
	mux.Handle("POST /runners/{name}/approve", wb.guard(wb.approve))
	mux.Handle("POST /runners/{name}/reject", wb.guard(wb.reject))
	mux.Handle("POST /runners/clear-waiting", wb.guard(wb.clearWaiting))
	mux.Handle("GET /jobs", wb.guard(wb.jobsPage))
	mux.Handle("POST /jobs", wb.guard(wb.startJob))
	mux.Handle("GET /jobs/{id}", wb.guard(wb.jobPage))
	mux.Handle("GET /jobs/{id}/summary", wb.guard(wb.summaryFragment))
	mux.Handle("GET /jobs/{id}/stream", wb.guard(wb.stream))
	mux.Handle("POST /jobs/{id}/cancel", wb.guard(wb.cancel))
	// Unknown paths are 404 pages, but only for a signed-in admin: to anyone else every
	// path looks the same (a redirect to sign in).
	mux.Handle("/", wb.guard(func(w http.ResponseWriter, r *http.Request, v visit) {
		wb.fail(w, r, &v, http.StatusNotFound, "Not found", "There is no page at "+display.OneLine(r.URL.Path, 200)+".")
	}))
	return wb.secureHeaders(mux)
}

// secureHeaders sets the headers every answer of the page carries.
func (wb *web) secureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
		if overTLS(r) {
			h.Set("Strict-Transport-Security", "max-age=31536000")
		}
		// Pages show fingerprints and job data: no cache keeps a copy. The assets are small
		// and change with the binary, so they are revalidated rather than versioned.
		if strings.HasPrefix(r.URL.Path, "/static/") {
			h.Set("Cache-Control", "no-cache")
		} else {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

// visit is a signed-in request: the session id (never logged) and a copy of the session.
type visit struct {
	id   string
	sess webSession
}

type pageHandler func(w http.ResponseWriter, r *http.Request, v visit)

// guard lets a request through only with a live session; anyone else is sent (303) to sign
// in and comes back after. A POST must also carry the session's CSRF token, or it is refused
// (403) before anything changes.
func (wb *web) guard(next pageHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := sessionID(r)
		sess, ok := wb.sessions.get(id)
		if !ok {
			if id != "" {
				http.SetCookie(w, clearedCookie(r))
			}
			back := "/runners"
			if r.Method == http.MethodGet {
				back = r.URL.RequestURI()
			}
			http.Redirect(w, r, "/signin?next="+url.QueryEscape(back), http.StatusSeeOther)
			return
		}
		v := visit{id: id, sess: sess}
		if r.Method == http.MethodPost {
			limit := int64(api.MaxSmallBody)
			if r.URL.Path == "/jobs" {
				limit = api.MaxJobBody
			}
			r.Body = http.MaxBytesReader(w, r.Body, limit)
			if err := r.ParseForm(); err != nil {
				var tooLarge *http.MaxBytesError
				if errors.As(err, &tooLarge) {
					wb.fail(w, r, &v, http.StatusRequestEntityTooLarge, "Too large", "The form is larger than "+byteSize(limit)+": put large data in the inventory or the repository.")
					return
				}
				wb.fail(w, r, &v, http.StatusBadRequest, "Bad request", "The form could not be read: "+display.OneLine(err.Error(), 200)+".")
				return
			}
			if crossSite(r) || !validCSRF(sess, r.PostFormValue(csrfField)) {
				wb.log.Warn("admin page refused a form without its session's CSRF token",
					zap.String("method", r.Method), zap.String("path", display.OneLine(r.URL.Path, 200)), zap.String("remote_addr", r.RemoteAddr))
				wb.fail(w, r, &v, http.StatusForbidden, "Form refused",
					"This form did not come from this page, or it is stale: nothing was changed. Reload the page and try again.")
				return
			}
		}
		next(w, r, v)
	})
}

// page is what every template gets: the layout's fields and the page's own Data.
type page struct {
	Title   string
	Section string // "runners" or "jobs": the menu entry to highlight
	Signed  bool
	CSRF    string
	Flash   string // a one-time message from the last action
	Error   string // why the last request was refused, shown above the page
	Waiting int    // registration requests waiting for an admin, for the menu
	Data    any
}

// render draws a page into a buffer first, so a template failure becomes a clean 500 and
// never half a page.
func (wb *web) render(w http.ResponseWriter, r *http.Request, v *visit, status int, name string, p page) {
	if v != nil {
		p.Signed = true
		p.CSRF = v.sess.csrf
		p.Flash = wb.sessions.takeFlash(v.id)
		p.Waiting = wb.waitingCount(r.Context())
	}
	wb.draw(w, status, name, "layout", p)
}

func (wb *web) draw(w http.ResponseWriter, status int, name, tmpl string, data any) {
	var buf bytes.Buffer
	if err := wb.pages[name].ExecuteTemplate(&buf, tmpl, data); err != nil {
		wb.log.Error("draw a page failed", zap.String("page", name), zap.Error(err))
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte("the page could not be drawn: the app's log says why\n"))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// errorPage is the Data of error.html.
type errorPage struct {
	Status  int
	Message string
}

// fail answers with an error page: the status, a title and a sentence that says what to do.
func (wb *web) fail(w http.ResponseWriter, r *http.Request, v *visit, status int, title, msg string) {
	wb.render(w, r, v, status, "error.html", page{Title: title, Data: errorPage{Status: status, Message: msg}})
}

// internal answers 500 and logs the cause; the page says what failed, not the details.
func (wb *web) internal(w http.ResponseWriter, r *http.Request, v *visit, what string, err error) {
	if errors.Is(err, context.Canceled) {
		return // the browser went away; nobody reads an answer
	}
	wb.log.Error(what+" failed", zap.Error(err))
	wb.fail(w, r, v, http.StatusInternalServerError, "Something failed", what+" failed in the app: its log says why.")
}

// failure shows err: a refusal with its own status and message, anything else as a 500.
func (wb *web) failure(w http.ResponseWriter, r *http.Request, v *visit, what string, err error) {
	var ref *api.Refusal
	if errors.As(err, &ref) {
		title := "Refused"
		if ref.Status == http.StatusNotFound {
			title = "Not found"
		}
		wb.fail(w, r, v, ref.Status, title, sentence(ref.Message))
		return
	}
	wb.internal(w, r, v, what, err)
}

// waitingCount counts the runners that wait for an admin; 0 when the store cannot say.
func (wb *web) waitingCount(ctx context.Context) int {
	runners, err := wb.api.App().ListRunners(ctx)
	if err != nil {
		return 0
	}
	n := 0
	for _, r := range runners {
		if r.State == app.StateWaiting {
			n++
		}
	}
	return n
}

// signinPage shows the sign-in form, or sends a signed-in admin on.
func (wb *web) signinPage(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.URL.Query().Get("next"))
	if _, ok := wb.sessions.get(sessionID(r)); ok {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	p := page{Title: "Sign in", Data: signinData{Next: next, Insecure: !overTLS(r) && !loopbackHost(r), SignedOut: r.URL.Query().Has("signed_out")}}
	wb.render(w, r, nil, http.StatusOK, "signin.html", p)
}

// signinData is the Data of signin.html.
type signinData struct {
	Next      string
	Insecure  bool // plain HTTP to an address that is not loopback: signing in is refused
	SignedOut bool
}

// signin checks the admin token and starts a session. Over plain HTTP it signs in only on a
// loopback address: anywhere else the token and the cookie would cross the network in clear.
func (wb *web) signin(w http.ResponseWriter, r *http.Request) {
	if crossSite(r) {
		wb.fail(w, r, nil, http.StatusForbidden, "Form refused", "This sign-in form was sent from another site: nothing was changed. Open the sign-in page of this app and sign in there.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, api.MaxSmallBody)
	if err := r.ParseForm(); err != nil {
		wb.fail(w, r, nil, http.StatusBadRequest, "Bad request", "The sign-in form could not be read: "+display.OneLine(err.Error(), 200)+".")
		return
	}
	next := safeNext(r.PostFormValue("next"))
	data := signinData{Next: next, Insecure: !overTLS(r) && !loopbackHost(r)}
	if data.Insecure {
		wb.log.Warn("admin page sign-in refused: plain http on an address that is not loopback", zap.String("remote_addr", r.RemoteAddr))
		wb.render(w, r, nil, http.StatusForbidden, "signin.html", page{Title: "Sign in", Data: data,
			Error: "Signing in over plain HTTP is refused here: the admin token would cross the network in clear. Put a TLS proxy in front of rte-app (sending X-Forwarded-Proto: https), or reach it through an SSH tunnel at http://localhost."})
		return
	}
	if !wb.api.TokenMatches(r.PostFormValue("token")) {
		wb.log.Warn("admin page sign-in refused: wrong admin token", zap.String("remote_addr", r.RemoteAddr))
		wb.render(w, r, nil, http.StatusUnauthorized, "signin.html", page{Title: "Sign in", Data: data,
			Error: "That is not the admin token. Use the APP_ADMIN_TOKEN that rte-app was started with."})
		return
	}
	// A new id at every sign-in, so an id planted before sign-in is worth nothing after it.
	if old := sessionID(r); old != "" {
		wb.sessions.end(old)
	}
	id := wb.sessions.create()
	http.SetCookie(w, sessionCookie(r, id))
	wb.log.Info("admin signed in to the admin page", zap.String("remote_addr", r.RemoteAddr), zap.Bool("tls", overTLS(r)))
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (wb *web) signout(w http.ResponseWriter, r *http.Request, v visit) {
	wb.sessions.end(v.id)
	http.SetCookie(w, clearedCookie(r))
	wb.log.Info("admin signed out of the admin page", zap.String("remote_addr", r.RemoteAddr))
	http.Redirect(w, r, "/signin?signed_out", http.StatusSeeOther)
}

// crossSite reports a request that the browser says another site's page sent. It guards the
// sign-in form, which has no session yet to carry a CSRF token, and backs the tokens up on
// every other form. Browsers that do not send Sec-Fetch-Site are let through; SameSite=Strict
// and the tokens still hold for them.
func crossSite(r *http.Request) bool {
	return r.Header.Get("Sec-Fetch-Site") == "cross-site"
}

// safeNext returns where to go after sign-in: a path on this app, never another site
// ("//evil.example", "/\evil.example" and absolute URLs are refused), else the runners.
func safeNext(next string) string {
	const home = "/runners"
	if next == "" || len(next) > 2000 || !strings.HasPrefix(next, "/") ||
		strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") ||
		strings.ContainsFunc(next, func(r rune) bool { return r < ' ' || r == 0x7f || r == '\\' }) {
		return home
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return home
	}
	return next
}

// sentence makes an API error read as a sentence on a page: capitalised, with a full stop.
func sentence(msg string) string {
	msg = strings.TrimSpace(msg)
	if msg == "" {
		return msg
	}
	if !strings.HasSuffix(msg, ".") {
		msg += "."
	}
	return strings.ToUpper(msg[:1]) + msg[1:]
}

func byteSize(n int64) string {
	switch {
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
