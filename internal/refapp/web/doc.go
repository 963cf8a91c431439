// Package web is the reference app's admin page: Runners (with the approval review), Jobs
// (start, follow live, cancel), served from templates and assets embedded from templates/ and
// static/. It signs in with APP_ADMIN_TOKEN and then works on a server-side session; every
// POST carries the session's CSRF token. docs/admin-page.md describes it.
//
// It decides nothing itself: approval, submission and the live stream go through package
// api's methods, so the page and the API refuse the same things with the same words. It
// refuses every page to a visitor without a session (a redirect to sign in, whatever the
// path), cross-site POSTs, inline scripts and styles, and being framed.
package web
