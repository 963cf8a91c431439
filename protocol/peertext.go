package protocol

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// PeerText makes text that came from outside (a peer's message, a file name in a bundle, a
// command's error) safe for a log line or an error: valid UTF-8, control characters turned into
// spaces so it stays on one line, and at most n bytes, cut on a character boundary with "..."
// after it. Both halves bound peer text before logging it; this is the one place that does it.
func PeerText(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
