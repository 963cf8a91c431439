package web

// Names the external tests (package web_test) need: they cannot be internal tests, because
// the test app they start (refapptest) imports this package through package server.
const (
	CookieSecure = cookieSecure
	CookiePlain  = cookiePlain
	CSRFField    = csrfField
)

var (
	NewSummaryView = newSummaryView
)
