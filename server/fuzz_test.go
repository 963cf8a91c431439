package server

import (
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/rte-project/rte/protocol"
)

// FuzzAuthorization feeds arbitrary Authorization and X-App-Node headers to the token check and
// the log sanitizer: only the exact token may pass, and what goes into a log is bounded, valid
// UTF-8 without control characters.
func FuzzAuthorization(f *testing.F) {
	const token = "0123456789abcdef-token"
	for _, seed := range []string{"", "Bearer " + token, "bearer  " + token + " ", "Basic x", "Bearer", "Bearer \x00", "Bearer " + token + "\n"} {
		f.Add(seed)
	}
	want := sha256.Sum256([]byte(token))
	f.Fuzz(func(t *testing.T, header string) {
		r := &http.Request{Header: http.Header{"Authorization": {header}}}
		reason := checkBearer(r, want)
		scheme, rest, _ := strings.Cut(header, " ")
		exact := strings.EqualFold(scheme, "Bearer") && strings.TrimSpace(rest) == token
		if (reason == "") != exact {
			t.Fatalf("checkBearer(%q) = %q; the header carries the token: %v", header, reason, exact)
		}
		if reason != "" && reason != authMissing && reason != authWrong {
			t.Fatalf("checkBearer(%q) = %q, want %q or %q", header, reason, authMissing, authWrong)
		}
		out := protocol.PeerText(header, maxAppNode)
		if !utf8.ValidString(out) || len(out) > maxAppNode+3 || strings.IndexFunc(out, unicode.IsControl) >= 0 {
			t.Fatalf("PeerText(%q) = %q: want valid UTF-8, no control characters, at most %d bytes", header, out, maxAppNode+3)
		}
	})
}
