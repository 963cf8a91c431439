package pinning

import (
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzInterpret feeds the registration answer decoder whatever an app (or whatever answers at
// APP_URL) might send back.
func FuzzInterpret(f *testing.F) {
	f.Add(201, []byte(`{"state":"approved"}`))
	f.Add(202, []byte(`{"state":"pending","token_fingerprint":"abcd-ef12","certificate_fingerprint":"1234-5678"}`))
	f.Add(409, []byte(`{"error":"certificate changed"}`))
	f.Add(400, []byte(`{"error":"\u0073ecret-token-123456"}`))
	f.Add(503, []byte("<html>bad gateway</html>"))
	f.Add(200, []byte(`{"state":`))
	f.Add(302, []byte{})
	f.Add(418, []byte("\xff\xfe\x00binary"))
	const token = "secret-token-123456"
	redact := func(s string) string { return strings.ReplaceAll(s, token, "[redacted]") }
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		if status < 100 || status > 599 {
			return
		}
		a := interpret(status, body, redact)
		switch a.state {
		case StateApproved, StatePending:
			if status < 200 || status >= 300 {
				t.Errorf("status %d gave state %s, want only 2xx to succeed", status, a.state)
			}
		case StateRefused:
			if status < 300 || status >= 500 || status == http.StatusRequestTimeout {
				t.Errorf("status %d gave a refusal, want refusals only for 3xx and 4xx", status)
			}
		case StateUnreachable:
			if status >= 200 && status < 300 {
				t.Errorf("status %d gave a retry", status)
			}
		default:
			t.Fatalf("status %d gave unknown state %q", status, a.state)
		}
		for name, s := range map[string]string{"cause": a.cause, "state": a.resp.State,
			"token_fingerprint": a.resp.TokenFingerprint, "certificate_fingerprint": a.resp.CertificateFingerprint} {
			if len(s) > 2*maxPeerText+100 {
				t.Errorf("%s is %d bytes, want it clipped", name, len(s))
			}
			if !utf8.ValidString(s) {
				t.Errorf("%s %q is not valid UTF-8", name, s)
			}
			if strings.Contains(s, token) {
				t.Errorf("%s %q contains the token", name, s)
			}
			if strings.ContainsAny(s, "\n\r") {
				t.Errorf("%s %q spans lines", name, s)
			}
		}
	})
}
