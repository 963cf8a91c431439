package web

import (
	"crypto/sha256"
	"crypto/subtle"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/rte-project/rte/internal/refapp/settings"
)

// Admin page sessions. An admin signs in with APP_ADMIN_TOKEN once; the page then carries a
// random session id in a cookie. Sessions live in this process's memory only, so a restart
// signs everyone out: that costs a sign-in, and keeps the database free of credentials.

// Session limits. Variables so a test can shorten them.
var (
	// sessionIdle ends a session nobody used for this long: a forgotten browser tab does not
	// stay an open door.
	sessionIdle = 2 * time.Hour
	// sessionMax ends a session this long after sign-in, used or not.
	sessionMax = 12 * time.Hour
)

// maxSessions bounds the sessions held at once; signing in past it ends the oldest. Only a
// holder of the admin token can create one, so the bound is against a runaway script, not
// an attacker.
const maxSessions = 1000

// Cookie names. Over TLS the cookie gets the __Host- prefix, which browsers accept only with
// Secure, Path=/ and no Domain, so a sibling host cannot plant or shadow it.
const (
	cookieSecure = "__Host-rte_app_session"
	cookiePlain  = "rte_app_session"
)

// csrfField is the form field that carries a session's CSRF token in every POST.
const csrfField = "csrf"

// webSession is one signed-in browser.
type webSession struct {
	csrf            string // the synchronizer token forms carry
	created, usedAt time.Time
	flash           string // a message shown once on the next page, then cleared
}

// sessionStore holds the sessions by the SHA-256 of their id, so a lookup's timing says
// nothing useful about ids that exist. Safe for concurrent use.
type sessionStore struct {
	mu  sync.Mutex
	m   map[[sha256.Size]byte]*webSession
	now func() time.Time
}

func newSessionStore(now func() time.Time) *sessionStore {
	return &sessionStore{m: map[[sha256.Size]byte]*webSession{}, now: now}
}

// create starts a session and returns its id (for the cookie only: it is never logged).
func (s *sessionStore) create() string {
	id := settings.NewToken()
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(now)
	if len(s.m) >= maxSessions {
		var oldestKey [sha256.Size]byte
		var oldest time.Time
		for k, v := range s.m {
			if oldest.IsZero() || v.created.Before(oldest) {
				oldestKey, oldest = k, v.created
			}
		}
		delete(s.m, oldestKey)
	}
	s.m[sha256.Sum256([]byte(id))] = &webSession{csrf: settings.NewToken(), created: now, usedAt: now}
	return id
}

// get returns a copy of the live session for id and marks it used; ok is false for an id
// that is unknown, signed out or expired.
func (s *sessionStore) get(id string) (webSession, bool) {
	if id == "" {
		return webSession{}, false
	}
	key := sha256.Sum256([]byte(id))
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.m[key]
	if sess == nil {
		return webSession{}, false
	}
	if expired(sess, now) {
		delete(s.m, key)
		return webSession{}, false
	}
	sess.usedAt = now
	return *sess, true
}

// takeFlash returns the session's one-time message and clears it.
func (s *sessionStore) takeFlash(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.m[sha256.Sum256([]byte(id))]
	if sess == nil {
		return ""
	}
	msg := sess.flash
	sess.flash = ""
	return msg
}

// setFlash keeps a message for the session's next page (after a redirect).
func (s *sessionStore) setFlash(id, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess := s.m[sha256.Sum256([]byte(id))]; sess != nil {
		sess.flash = msg
	}
}

// end signs the session out.
func (s *sessionStore) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, sha256.Sum256([]byte(id)))
}

func (s *sessionStore) sweepLocked(now time.Time) {
	for k, v := range s.m {
		if expired(v, now) {
			delete(s.m, k)
		}
	}
}

func expired(s *webSession, now time.Time) bool {
	return now.Sub(s.usedAt) > sessionIdle || now.Sub(s.created) > sessionMax
}

// validCSRF compares a form's token with the session's in constant time.
func validCSRF(sess webSession, given string) bool {
	return given != "" && subtle.ConstantTimeCompare([]byte(given), []byte(sess.csrf)) == 1
}

// overTLS reports whether the browser reached the app over TLS: directly, or through a
// proxy that terminated it and says so. A forged X-Forwarded-Proto only makes the forger's
// own cookie Secure, which their browser then withholds over plain HTTP.
func overTLS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	return strings.EqualFold(strings.TrimSpace(proto), "https")
}

// loopbackHost reports whether the browser addressed the app by a loopback name or address
// (localhost, 127.0.0.1, [::1]): traffic that never leaves the machine, or an SSH tunnel.
func loopbackHost(r *http.Request) bool {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// cookieName is the session cookie's name for this request: a Secure __Host- cookie over
// TLS, a plain one on loopback HTTP, where browsers would not send a Secure cookie back.
func cookieName(r *http.Request) string {
	if overTLS(r) {
		return cookieSecure
	}
	return cookiePlain
}

// sessionCookie is the cookie that carries id: HttpOnly (no script reads it), SameSite=Strict
// (no other site's page sends it), Path=/, and Secure whenever the request came over TLS.
// It has no Max-Age, so it ends with the browser; the server ends it sooner (sessionIdle).
func sessionCookie(r *http.Request, id string) *http.Cookie {
	return &http.Cookie{
		Name:     cookieName(r),
		Value:    id,
		Path:     "/",
		HttpOnly: true,
		Secure:   overTLS(r),
		SameSite: http.SameSiteStrictMode,
	}
}

// clearedCookie removes the session cookie from the browser.
func clearedCookie(r *http.Request) *http.Cookie {
	c := sessionCookie(r, "")
	c.MaxAge = -1
	return c
}

// sessionID is the id the request's cookie carries, or "".
func sessionID(r *http.Request) string {
	c, err := r.Cookie(cookieName(r))
	if err != nil {
		return ""
	}
	return c.Value
}
