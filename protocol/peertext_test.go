package protocol

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestPeerText(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"plain", 5, "plain"},
		{"two\nlines\r\tand a tab", 100, "two lines  and a tab"},
		{"bad \xff byte", 100, "bad ? byte"},
		{"0123456789", 5, "01234..."},
		{"ééééé", 5, "éé..."}, // byte 5 is inside the third é: cut back to 4
	} {
		if got := PeerText(c.in, c.n); got != c.want {
			t.Errorf("PeerText(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

func FuzzPeerText(f *testing.F) {
	f.Add("a\x00b\xffc\u2028d", 3)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		out := PeerText(s, n)
		if !utf8.ValidString(out) || len(out) > n+3 || strings.IndexFunc(out, unicode.IsControl) >= 0 {
			t.Fatalf("PeerText(%q, %d) = %q: want valid UTF-8, no control characters, at most %d bytes", s, n, out, n+3)
		}
	})
}
